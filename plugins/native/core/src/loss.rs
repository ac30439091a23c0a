//! Token-level losses over logits, writing dlogits in place.
//!
//! # Alignment
//! Inputs are token-aligned `[B, T]` arrays: entry `(b, j)` refers to token `tokens[b, j]`
//! as a *target*, predicted from the logits at position `j − 1`. Entry `j = 0` has no
//! prediction and is ignored (its mask is treated as 0). `mask[b, j] ∈ {0, 1}` (any
//! non-negative weight works) selects the tokens that count: typically response tokens.
//!
//! # The policy loss (GRPO / PPO-clip with optional k3 KL) — the one shared definition
//! For every counted token `i` with new logprob `lp_i = log π_θ(token_i | prefix)`, behaviour
//! logprob `old_i`, advantage `A_i` and (optionally) reference logprob `ref_i`:
//!
//! ```text
//! r_i     = exp(lp_i − old_i)
//! pg_i    = −min(r_i · A_i, clip(r_i, 1 − ε_low, 1 + ε_high) · A_i)
//! kl_i    = exp(ref_i − lp_i) − (ref_i − lp_i) − 1          (k3 estimator, ≥ 0)
//! L       = Σ_i mask_i · (pg_i + β · kl_i) / Z
//! ```
//!
//! with `Z = Σ_i mask_i` over the whole batch (token-level mean, as in DAPO), unless the
//! caller passes an explicit normaliser (e.g. the token count of the global batch when a
//! step is accumulated over micro-batches). `β = 0` or no reference disables the KL term.
//! The gradient flows through `lp_i` only (`old_i`, `A_i`, `ref_i` are constants):
//! `∂pg/∂lp = −A·r` when the unclipped term is the minimum, else 0;
//! `∂kl/∂lp = 1 − exp(ref − lp)`.
//!
//! # Advantages (GRPO)
//! [`grpo_advantages`]: for each group of `G` samples of one prompt with rewards `R_1..R_G`,
//! `A_i = (R_i − mean(R)) / (std(R) + 1e-6)` (population std; `scale_by_std = false` gives
//! `A_i = R_i − mean(R)`). Every response token of sample i gets `A_i`.
//!
//! # SFT
//! `L = Σ_i mask_i · (−lp_i) / Z`, same alignment and normaliser.

use rayon::prelude::*;

use crate::error::{NativeError, Result};

/// Hyper-parameters of the policy loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossConfig {
    /// ε_low: lower clip is `1 − clip_low`.
    pub clip_low: f32,
    /// ε_high: upper clip is `1 + clip_high`.
    pub clip_high: f32,
    /// β: weight of the k3 KL to the reference policy.
    pub kl_coef: f32,
}

impl Default for PolicyLossConfig {
    fn default() -> Self {
        PolicyLossConfig {
            clip_low: 0.2,
            clip_high: 0.2,
            kl_coef: 0.0,
        }
    }
}

/// Which loss to apply, with its per-token inputs (token-aligned `[B, T]`).
#[derive(Debug, Clone, Copy)]
pub enum Loss<'a> {
    /// Cross-entropy on the masked tokens.
    Sft,
    /// PPO-clip / GRPO policy loss.
    Policy {
        /// Clip and KL settings.
        cfg: PolicyLossConfig,
        /// Advantage per token.
        advantages: &'a [f32],
        /// Logprobs of the behaviour policy (the engine's).
        old_logprobs: &'a [f32],
        /// Reference-policy logprobs (needed when `kl_coef > 0`).
        ref_logprobs: Option<&'a [f32]>,
    },
}

/// Aggregates of one loss evaluation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// The loss value `L`.
    pub loss: f64,
    /// Σ mask.
    pub tokens: f64,
    /// Masked mean of k3 KL (0 without reference).
    pub kl: f64,
    /// Fraction of counted tokens whose gradient was clipped away.
    pub clip_frac: f64,
    /// Masked mean of `−lp` (the NLL), for monitoring.
    pub nll: f64,
}

/// Applies `loss` to `logits [B·T, V]`, overwriting them with `∂L/∂logits`; also writes the
/// new per-token logprobs into `logprobs_out` (token-aligned; entry 0 of each row = 0).
#[allow(clippy::too_many_arguments)]
pub fn apply_loss(
    logits: &mut [f32],
    vocab: usize,
    tokens: &[u32],
    t: usize,
    mask: &[f32],
    loss: &Loss<'_>,
    normalizer: Option<f32>,
    logprobs_out: &mut [f32],
) -> Result<LossStats> {
    let n = tokens.len();
    let bad = |m: String| Err(NativeError::Input(m));
    if t == 0
        || !n.is_multiple_of(t)
        || logits.len() < n * vocab
        || mask.len() != n
        || logprobs_out.len() != n
    {
        return bad(format!(
            "loss inputs disagree: {n} tokens, T={t}, {} mask entries, {} logit f32 for vocab {vocab}",
            mask.len(),
            logits.len()
        ));
    }
    if let Some(bad_tok) = tokens.iter().find(|&&x| x as usize >= vocab) {
        return bad(format!(
            "token id {bad_tok} is out of range for vocab {vocab}"
        ));
    }
    if let Loss::Policy {
        cfg,
        advantages,
        old_logprobs,
        ref_logprobs,
    } = loss
    {
        if advantages.len() != n
            || old_logprobs.len() != n
            || ref_logprobs.is_some_and(|r| r.len() != n)
        {
            return bad(
                "advantages / old_logprobs / ref_logprobs must have one entry per token".into(),
            );
        }
        if cfg.kl_coef > 0.0 && ref_logprobs.is_none() {
            return bad("kl_coef > 0 needs ref_logprobs".into());
        }
    }
    logprobs_out.fill(0.0);
    let counted = |i: usize| if i.is_multiple_of(t) { 0.0 } else { mask[i] };
    let z: f32 = normalizer.unwrap_or_else(|| (0..n).map(counted).sum());
    let z = if z > 0.0 { z } else { 1.0 };
    // Row r predicts token r + 1 (same sequence); row t−1 of each sequence predicts nothing.
    let per_row: Vec<[f64; 5]> = logits[..n * vocab]
        .par_chunks_mut(vocab)
        .zip(
            logprobs_out
                .par_iter_mut()
                .skip(1)
                .chain(rayon::iter::once(&mut 0.0f32)),
        )
        .enumerate()
        .map(|(row, (lg, lp_out))| {
            let i = row + 1; // token index this row predicts
            let m = if i < n && i % t != 0 { mask[i] } else { 0.0 };
            if i % t == 0 || i >= n {
                lg.fill(0.0);
                return [0.0; 5];
            }
            let tok = tokens[i] as usize;
            let lse64 = crate::sampling::log_sum_exp(lg);
            let lse = lse64 as f32;
            let lp = (f64::from(lg[tok]) - lse64) as f32;
            *lp_out = lp;
            if m == 0.0 {
                lg.fill(0.0);
                return [0.0; 5];
            }
            let (val, dlp, kl, clipped) = match loss {
                Loss::Sft => (-lp, -1.0, 0.0, 0.0),
                Loss::Policy {
                    cfg,
                    advantages,
                    old_logprobs,
                    ref_logprobs,
                } => {
                    let a = advantages[i];
                    let r = (lp - old_logprobs[i]).exp();
                    let rc = r.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
                    let (s1, s2) = (r * a, rc * a);
                    let (pg, mut g, clipped) = if s1 <= s2 {
                        (-s1, -a * r, 0.0)
                    } else {
                        (-s2, 0.0, 1.0)
                    };
                    let mut val = pg;
                    let mut kl = 0.0;
                    if let Some(rf) = ref_logprobs {
                        let dlt = rf[i] - lp;
                        kl = dlt.exp() - dlt - 1.0;
                        if cfg.kl_coef > 0.0 {
                            val += cfg.kl_coef * kl;
                            g += cfg.kl_coef * (1.0 - dlt.exp());
                        }
                    }
                    (val, g, kl, clipped)
                }
            };
            // ∂L/∂logit_v = (m/Z) · dlp · (onehot_v − softmax_v)
            let coef = m / z * dlp;
            for x in lg.iter_mut() {
                *x = -coef * (*x - lse).exp();
            }
            lg[tok] += coef;
            [
                (m * val) as f64,
                m as f64,
                (m * kl) as f64,
                (m * clipped) as f64,
                (-m * lp) as f64,
            ]
        })
        .collect();
    let mut acc = [0f64; 5];
    for r in &per_row {
        for (a, b) in acc.iter_mut().zip(r) {
            *a += b;
        }
    }
    let tok = acc[1].max(1e-12);
    Ok(LossStats {
        loss: acc[0] / z as f64,
        tokens: acc[1],
        kl: acc[2] / tok,
        clip_frac: acc[3] / tok,
        nll: acc[4] / tok,
    })
}

/// GRPO group-relative advantages: `rewards` holds consecutive groups of `group` samples.
/// See the module doc for the exact definition.
pub fn grpo_advantages(rewards: &[f32], group: usize, scale_by_std: bool) -> Result<Vec<f32>> {
    if group == 0 || !rewards.len().is_multiple_of(group) {
        return Err(NativeError::Input(format!(
            "{} rewards do not split into groups of {group}",
            rewards.len()
        )));
    }
    let mut out = Vec::with_capacity(rewards.len());
    for g in rewards.chunks_exact(group) {
        let mean = g.iter().map(|&r| r as f64).sum::<f64>() / group as f64;
        let var = g.iter().map(|&r| (r as f64 - mean).powi(2)).sum::<f64>() / group as f64;
        let denom = if scale_by_std { var.sqrt() + 1e-6 } else { 1.0 };
        out.extend(g.iter().map(|&r| ((r as f64 - mean) / denom) as f32));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpo_advantages_are_group_normalised() {
        let a = grpo_advantages(&[1.0, 0.0, 0.0, 1.0, 5.0, 5.0], 2, true).unwrap();
        assert!(
            (a[0] - 1.0).abs() < 1e-4 && (a[1] + 1.0).abs() < 1e-4,
            "{a:?}"
        );
        assert!((a[2] + 1.0).abs() < 1e-4 && (a[3] - 1.0).abs() < 1e-4);
        assert_eq!(&a[4..], &[0.0, 0.0], "equal rewards carry no signal");
        let b = grpo_advantages(&[3.0, 1.0], 2, false).unwrap();
        assert_eq!(b, vec![1.0, -1.0]);
        assert!(grpo_advantages(&[1.0, 2.0, 3.0], 2, true).is_err());
    }

    #[test]
    fn policy_loss_value_matches_the_documented_formula() {
        // One sequence of 2 tokens, vocab 3: only token 1 counts.
        let mut logits = vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let tokens = [0u32, 2];
        let mask = [0.0, 1.0];
        let lp = (1.0f32 / 3.0).ln();
        let (adv, old, rf) = ([0.0, 2.0], [0.0, lp - 0.5], [0.0, lp + 0.3]);
        let cfg = PolicyLossConfig {
            clip_low: 0.2,
            clip_high: 0.2,
            kl_coef: 0.1,
        };
        let loss = Loss::Policy {
            cfg,
            advantages: &adv,
            old_logprobs: &old,
            ref_logprobs: Some(&rf),
        };
        let mut out = [0.0; 2];
        let st = apply_loss(&mut logits, 3, &tokens, 2, &mask, &loss, None, &mut out).unwrap();
        // r = e^0.5 > 1.2 with A > 0: clipped term 1.2·A is the min; k3 with Δ = 0.3.
        let want = -(1.2 * 2.0) + 0.1 * (0.3f64.exp() - 0.3 - 1.0);
        assert!((st.loss - want).abs() < 1e-5, "{} vs {want}", st.loss);
        assert_eq!(st.clip_frac, 1.0);
        assert!((out[1] - lp).abs() < 1e-6);
    }
}
