"""Right-padded batches: token ids ``[b, t]``, the completion mask ``[b, t-1]`` and per-token
fields (behaviour / reference logprobs) aligned to it."""

import torch


class Padded:
    """Right-padded ids ``[b, t]`` and the completion mask ``[b, t-1]`` (entry ``j-1`` is the
    logprob of token ``j``)."""

    def __init__(self, seqs, vocab, device):
        if not seqs:
            seqs = [{"tokens": [0, 0], "prompt_len": 2}]
            self.dummy = True
        else:
            self.dummy = False
        t = max(len(s["tokens"]) for s in seqs)
        t = max(t, 2)
        ids = torch.zeros((len(seqs), t), dtype=torch.long)
        mask = torch.zeros((len(seqs), t - 1), dtype=torch.float32)
        self.spans = []
        for i, s in enumerate(seqs):
            toks, p = s["tokens"], int(s["prompt_len"])
            n = len(toks)
            if not 1 <= p <= n:
                raise ValueError(f"sequence {i}: prompt_len {p} must be in 1..={n} (the first token has no logprob)")
            bad = [x for x in toks if not 0 <= x < vocab]
            if bad:
                raise ValueError(f"sequence {i}: token id {bad[0]} is out of range for vocab_size {vocab}")
            ids[i, :n] = torch.tensor(toks, dtype=torch.long)
            mask[i, p - 1 : n - 1] = 1.0
            self.spans.append((p, n))
        self.ids = ids.to(device)
        self.mask = mask.to(device)

    def aligned(self, seqs, field):
        """``field`` (per-sequence completion values) scattered to ``[b, t-1]``, or None when
        every sequence leaves it empty."""
        if self.dummy or all(len(s.get(field) or []) == 0 for s in seqs):
            return None
        out = torch.zeros_like(self.mask)
        for i, (s, (p, n)) in enumerate(zip(seqs, self.spans)):
            vals = s.get(field) or []
            if len(vals) != n - p:
                raise ValueError(f"sequence {i}: {field} has {len(vals)} entries for {n - p} completion tokens")
            out[i, p - 1 : n - 1] = torch.tensor(vals, dtype=out.dtype)
        return out

    def completions(self, lp):
        if self.dummy:
            return []
        rows = lp.detach().cpu().tolist()
        return [rows[i][p - 1 : n - 1] for i, (p, n) in enumerate(self.spans)]
