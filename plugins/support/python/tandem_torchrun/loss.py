"""The policy and SFT losses — the same definition as the native trainer's.

The one written definition, with every variant, is the module doc of
``plugins/native/core/src/loss.rs``; this is its torch form. For every counted token ``i``
(a completion token, as a target) of sequence ``b`` with new logprob ``lp``, behaviour
logprob ``old``, advantage ``A`` and reference logprob ``ref``::

    ratio token (default):  r = exp(lp - old);  pg = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)
    ratio sequence (GSPO):  s_b = exp(mean over b's completion of (lp - old)); pg = the same with s_b
    kl k3 (default):        kl = exp(ref - lp) - (ref - lp) - 1      (only when kl_coef > 0)
    kl k1:                  kl = lp - ref
    l = pg + kl_coef * kl
    token_mean (default):   L = sum(mask * l) / Z                Z = completion tokens of the WHOLE batch
    sequence_mean:          L = sum_b (sum(mask_b * l_b) / n_b) / B     B = sequences of the WHOLE batch
    constant_length:        L = sum(mask * l) / (B * C)          C = the batch's constant_length

SFT: ``L = sum(mask * -lp) / Z``. Gradients flow through ``lp`` only. A sequence is never split,
so ``n_b`` and ``s_b`` are whole-sequence figures; the normaliser (:func:`normaliser`) is the
whole batch's. With the batch split over ranks, each rank's ``L`` is its part of the global sum,
and FSDP2 averages gradients over ranks, so the caller scales the backward by the world size (a
trainer that sums gradients over its data-parallel ranks does not).
"""

import torch


def _variant(cfg):
    """``(aggregation, ratio, kl_estimator)`` of the batch's loss settings (defaults: today's)."""
    return (
        cfg.get("aggregation", "token_mean"),
        cfg.get("ratio", "token"),
        cfg.get("kl_estimator", "k3"),
    )


def normaliser(seqs, cfg):
    """The normaliser of the whole batch ``seqs`` (every rank's sequences) for ``cfg``'s
    aggregation: its completion tokens (token-mean, and SFT), its sequences ``B``
    (sequence-mean) or ``B * constant_length`` (constant-length); at least 1."""
    aggregation, _, _ = _variant(cfg)
    if cfg["kind"] != "sft" and aggregation == "sequence_mean":
        z = float(len(seqs))
    elif cfg["kind"] != "sft" and aggregation == "constant_length":
        z = float(len(seqs)) * float(cfg["constant_length"])
    else:
        z = float(sum(len(s["tokens"]) - int(s["prompt_len"]) for s in seqs))
    return max(z, 1.0)


def policy_terms(lp, mask, adv, old, ref, cfg):
    """Weighted per-token loss terms and statistics sums for one rank's part of the batch.

    ``lp``, ``mask``, ``old`` and ``ref`` are ``[b, t-1]``; ``adv`` is ``[b, 1]``; ``old`` /
    ``ref`` may be None (on-policy / no KL). Returns ``(weighted, sums)``: ``weighted.sum() /
    normaliser(...)`` is this part's share of ``L``, and ``sums`` is a float64 tensor
    ``[loss·normaliser, nll·Z, kl·Z, clipped tokens, tokens]`` (detached).
    """
    kind = cfg["kind"]
    aggregation, ratio_level, estimator = _variant(cfg)
    nll = -lp
    kl = torch.zeros_like(lp)
    clipped = torch.zeros_like(lp)
    m = mask
    if kind == "sft":
        per_tok = nll
    else:
        if old is None:
            old = lp.detach()
        lo, hi = 1.0 - cfg["clip_eps_low"], 1.0 + cfg["clip_eps_high"]
        if ratio_level == "sequence":
            n = m.sum(dim=1, keepdim=True).clamp(min=1.0)
            ratio = torch.exp(((lp - old) * m).sum(dim=1, keepdim=True) / n)
        else:
            ratio = torch.exp(lp - old)
        unclipped = ratio * adv
        clipped_term = torch.clamp(ratio, lo, hi) * adv
        per_tok = -torch.minimum(unclipped, clipped_term)
        # The gradient is zero where the clipped term is the minimum and differs.
        clipped = ((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < lo))
        clipped = clipped.to(lp.dtype)
        if ratio_level == "sequence":
            per_tok = per_tok.expand_as(lp)
            clipped = clipped.expand_as(lp)
        beta = cfg["kl_coef"]
        if beta > 0.0:
            if ref is None:
                raise ValueError("train_step: kl_coef > 0 needs ref_logprobs on every sequence")
            if estimator == "k1":
                kl = lp - ref
            else:
                d = ref - lp
                kl = torch.exp(d) - d - 1.0
            per_tok = per_tok + beta * kl
    if kind != "sft" and aggregation == "sequence_mean":
        weighted = per_tok * (m / m.sum(dim=1, keepdim=True).clamp(min=1.0))
    else:
        weighted = per_tok * m
    sums = torch.stack(
        [
            weighted.sum(),
            (nll * m).sum(),
            (kl * m).sum(),
            (clipped * m).sum(),
            m.sum(),
        ]
    ).detach().to(torch.float64)
    return weighted, sums
