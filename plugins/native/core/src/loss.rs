//! Token-level losses over logits, writing dlogits in place.
//!
//! # Alignment
//! Inputs are token-aligned `[B, T]` arrays: entry `(b, j)` refers to token `tokens[b, j]`
//! as a *target*, predicted from the logits at position `j − 1`. Entry `j = 0` has no
//! prediction and is ignored (its mask is treated as 0). `mask[b, j] ∈ {0, 1}` (any
//! non-negative weight works) selects the tokens that count: typically response tokens.
//!
//! # The policy loss — the one shared definition
//! Every trainer (this crate; `plugins/support/python/tandem_torchrun/loss.py` for the `fsdp`
//! and `megatron` workers) implements exactly what this section says; the host chooses the
//! variant per step (`PolicyLoss` of `tandem-plugin-api`, `[algorithm]` in a job file).
//!
//! For every counted token `i` of sequence `b` with new logprob `lp_i = log π_θ(token_i |
//! prefix)`, behaviour logprob `old_i`, advantage `A_i` and (optionally) reference logprob
//! `ref_i`, with `n_b = Σ_{i∈b} mask_i` the counted tokens of `b` and `B` the sequences of the
//! batch:
//!
//! ```text
//! ratio = token (PPO, GRPO; the default):
//!   r_i  = exp(lp_i − old_i)
//!   pg_i = −min(r_i · A_i, clip(r_i, 1 − ε_low, 1 + ε_high) · A_i)
//! ratio = sequence (GSPO, Zheng et al. 2025):
//!   s_b  = exp(Σ_{i∈b} mask_i · (lp_i − old_i) / n_b)      the length-normalised ratio
//!   A_b  = Σ_{i∈b} mask_i · A_i / n_b                     (= the sequence's advantage)
//!   pg_i = −min(s_b · A_b, clip(s_b, 1 − ε_low, 1 + ε_high) · A_b)   for every i of b
//! kl_estimator = k3 (the default):  kl_i = exp(ref_i − lp_i) − (ref_i − lp_i) − 1   (≥ 0)
//! kl_estimator = k1:                kl_i = lp_i − ref_i
//! ℓ_i = pg_i + β · kl_i
//! aggregation = token-mean (the default; DAPO):  L = Σ_i mask_i · ℓ_i / Σ_i mask_i
//! aggregation = sequence-mean (GRPO's paper, GSPO): L = (1/B) Σ_b (Σ_{i∈b} mask_i · ℓ_i / n_b)
//! aggregation = constant-length (Dr. GRPO):      L = Σ_i mask_i · ℓ_i / (B · C)
//! ```
//!
//! `A_i` is per token: a sequence-level advantage (GRPO) is `A_b` on every token of `b`, PPO
//! with a critic passes each token's own (GAE); [`Loss::Policy`] takes the token-aligned array
//! either way, and only counted tokens' entries are read.
//!
//! `C` is the constant length, the generation budget (`max_tokens`). Every normaliser
//! (`Σ mask`, `B`, `B · C`) is that of the **whole batch of the step**: a trainer that splits
//! the batch over micro-batches or data-parallel ranks divides each part by the global
//! normaliser (the caller passes it here as `normalizer`), and a sequence is never split, so
//! `n_b` and `s_b` are always whole-sequence figures. `B` counts every sequence of the batch,
//! also one without completion tokens (it adds nothing to the sum). `ε_low ≠ ε_high` is
//! DAPO's clip-higher. `β = 0` or no reference disables the KL term.
//!
//! How the two ratio levels combine with the aggregations: with the sequence ratio every token
//! of `b` carries the same `pg_b`, so sequence-mean gives GSPO's objective exactly
//! (`(1/B) Σ_b pg_b` + the KL term), token-mean weighs each sequence's `pg_b` by its length
//! `n_b / Σ mask`, and constant-length by `n_b / (B · C)`.
//!
//! The gradient flows through `lp` only (`old`, `A`, `ref` are constants). With
//! `w_i = ∂L/∂ℓ_i` (`mask_i / Σ mask`, `mask_i / (n_b · B)` or `mask_i / (B · C)`):
//! `∂L/∂lp_i = w_i · (g_i + β · ∂kl_i/∂lp_i)` where `∂kl/∂lp = 1 − exp(ref − lp)` (k3) or `1`
//! (k1), and `g_i = −A_i · r_i` (token ratio) or `g_i = −A_b · s_b` (sequence ratio: the
//! sequence's term `Σ_{j∈b} w_j · ∂pg_b/∂lp_i` with `∂s_b/∂lp_i = s_b · mask_i / n_b`, and
//! `Σ_{j∈b} w_j = n_b · w_i / mask_i`) when the unclipped term is the minimum, else `0`. A
//! token (every token of a sequence, with the sequence ratio) whose gradient is clipped away
//! counts in `clip_frac`; the `kl` statistic is the masked mean of the estimator in use.
//!
use rayon::prelude::*;

use crate::error::{NativeError, Result};

mod terms;

pub(crate) use terms::LossTerms;

/// How the per-token terms are summed into `L` (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Aggregation {
    /// `Σ mask·ℓ / Σ mask`.
    #[default]
    TokenMean,
    /// The mean over sequences of each sequence's token mean.
    SequenceMean,
    /// `Σ mask·ℓ / (B · C)` with `C` the constant length (> 0).
    ConstantLength(f32),
}

/// The level of the importance ratio (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RatioLevel {
    /// One ratio per token.
    #[default]
    Token,
    /// One length-normalised ratio per sequence (GSPO).
    Sequence,
}

/// The KL estimator (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KlEstimator {
    /// `lp − ref`.
    K1,
    /// `exp(ref − lp) − (ref − lp) − 1`.
    #[default]
    K3,
}

/// Hyper-parameters of the policy loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossConfig {
    /// ε_low: lower clip is `1 − clip_low`.
    pub clip_low: f32,
    /// ε_high: upper clip is `1 + clip_high`.
    pub clip_high: f32,
    /// β: weight of the KL to the reference policy.
    pub kl_coef: f32,
    /// How the terms are summed.
    pub aggregation: Aggregation,
    /// Token or sequence ratio.
    pub ratio: RatioLevel,
    /// KL estimator.
    pub kl: KlEstimator,
}

impl Default for PolicyLossConfig {
    fn default() -> Self {
        PolicyLossConfig {
            clip_low: 0.2,
            clip_high: 0.2,
            kl_coef: 0.0,
            aggregation: Aggregation::TokenMean,
            ratio: RatioLevel::Token,
            kl: KlEstimator::K3,
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
    /// Masked mean of the KL estimator in use (0 without reference).
    pub kl: f64,
    /// Fraction of counted tokens whose gradient was clipped away.
    pub clip_frac: f64,
    /// Masked mean of `−lp` (the NLL), for monitoring.
    pub nll: f64,
}

/// Row-wise log-probabilities of the target tokens (token-aligned, entry 0 of each row = 0).
fn target_logprobs(logits: &[f32], vocab: usize, tokens: &[u32], t: usize) -> Vec<f32> {
    let n = tokens.len();
    let mut out = vec![0.0f32; n];
    out.par_iter_mut().enumerate().for_each(|(i, lp)| {
        if i % t != 0 {
            *lp = crate::sampling::logprob_of(
                &logits[(i - 1) * vocab..i * vocab],
                tokens[i] as usize,
            );
        }
    });
    out
}

/// The normaliser of `loss`'s aggregation over a whole batch of `[B, T]` token-aligned
/// `mask` entries: `Σ mask` (SFT, token-mean; entry 0 of each row never counts), `B`
/// (sequence-mean) or `B · C` (constant-length). What a trainer that splits the batch passes
/// to every part as `normalizer`.
pub fn batch_normalizer(loss: &Loss<'_>, t: usize, mask: &[f32]) -> f32 {
    let b = mask.len().checked_div(t).unwrap_or(0) as f32;
    match loss {
        Loss::Policy { cfg, .. } => match cfg.aggregation {
            Aggregation::TokenMean => counted_sum(t, mask),
            Aggregation::SequenceMean => b,
            Aggregation::ConstantLength(c) => b * c,
        },
        Loss::Sft => counted_sum(t, mask),
    }
}

fn counted_sum(t: usize, mask: &[f32]) -> f32 {
    (0..mask.len())
        .map(|i| {
            if t == 0 || i.is_multiple_of(t) {
                0.0
            } else {
                mask[i]
            }
        })
        .sum()
}

/// Applies `loss` to `logits [B·T, V]`, overwriting them with `∂L/∂logits`; also writes the
/// new per-token logprobs into `logprobs_out` (token-aligned; entry 0 of each row = 0).
///
/// `normalizer` is the normaliser of the loss's aggregation over the **whole batch of the
/// step** when `logits` hold only a part of it: `Σ mask` (SFT, token-mean), the number of
/// sequences `B` (sequence-mean) or `B · C` (constant-length); [`batch_normalizer`] computes
/// it. `None`: this batch is the whole batch. The trainer itself goes through the chunked
/// head ([`crate::head`]), which computes the same rows without the full logits.
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
    if t == 0
        || !n.is_multiple_of(t)
        || logits.len() < n * vocab
        || mask.len() != n
        || logprobs_out.len() != n
    {
        return Err(NativeError::Input(format!(
            "loss inputs disagree: {n} tokens, T={t}, {} mask entries, {} logit f32 for vocab {vocab}",
            mask.len(),
            logits.len()
        )));
    }
    let mut terms = LossTerms::new(vocab, tokens, t, mask, loss, normalizer)?;
    logprobs_out.fill(0.0);
    // The sequence ratio needs every logprob of a sequence before any of its gradients.
    if terms.needs_all_logprobs() {
        terms.set_logprobs(&target_logprobs(logits, vocab, tokens, t));
    }
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
            let (lp, terms) = terms.row(lg, row, true);
            if let Some(lp) = lp {
                *lp_out = lp;
            }
            terms
        })
        .collect();
    Ok(terms.finish(&per_row))
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
mod tests;
#[cfg(test)]
mod token_tests;
