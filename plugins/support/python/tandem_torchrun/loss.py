"""The policy and SFT losses — the same definition as the native trainer's.

The one written definition is ``plugins/native/core/src/loss.rs`` (module doc); this is its torch
form. For every counted token ``i`` (a completion token, as a target) with new logprob
``lp``, behaviour logprob ``old``, advantage ``A`` and reference logprob ``ref``::

    r  = exp(lp - old)
    pg = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)
    kl = exp(ref - lp) - (ref - lp) - 1            (k3, only when kl_coef > 0)
    L  = sum(mask * (pg + kl_coef * kl)) / Z       Z = completion tokens of the WHOLE batch

SFT: ``L = sum(mask * -lp) / Z``. Gradients flow through ``lp`` only. With the batch split
over ranks, each rank's ``L`` is its part of the global sum, and FSDP2 averages gradients
over ranks, so the caller scales the backward by the world size (a trainer that sums
gradients over its data-parallel ranks does not).
"""

import torch


def policy_terms(lp, mask, adv, old, ref, cfg):
    """Per-token loss terms and statistics sums for one rank's part of the batch.

    ``lp``, ``mask``, ``old`` and ``ref`` are ``[b, t-1]``; ``adv`` is ``[b, 1]``; ``old`` /
    ``ref`` may be None (on-policy / no KL). Returns ``(per_token, sums)`` where ``sums`` is a
    float64 tensor ``[loss·Z, nll·Z, kl·Z, clipped tokens, tokens]`` (detached).
    """
    kind = cfg["kind"]
    nll = -lp
    kl = torch.zeros_like(lp)
    clipped = torch.zeros_like(lp)
    if kind == "sft":
        per_tok = nll
    else:
        if old is None:
            old = lp.detach()
        ratio = torch.exp(lp - old)
        lo, hi = 1.0 - cfg["clip_eps_low"], 1.0 + cfg["clip_eps_high"]
        unclipped = ratio * adv
        clipped_term = torch.clamp(ratio, lo, hi) * adv
        per_tok = -torch.minimum(unclipped, clipped_term)
        # The gradient is zero where the clipped term is the minimum and differs.
        clipped = ((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < lo))
        clipped = clipped.to(lp.dtype)
        beta = cfg["kl_coef"]
        if beta > 0.0:
            if ref is None:
                raise ValueError("train_step: kl_coef > 0 needs ref_logprobs on every sequence")
            d = ref - lp
            kl = torch.exp(d) - d - 1.0
            per_tok = per_tok + beta * kl
    m = mask
    sums = torch.stack(
        [
            (per_tok * m).sum(),
            (nll * m).sum(),
            (kl * m).sum(),
            (clipped * m).sum(),
            m.sum(),
        ]
    ).detach().to(torch.float64)
    return per_tok, sums
