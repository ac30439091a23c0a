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

/// The sequence-level ratio of one sequence (GSPO): its policy term and `g` (see the module
/// doc), shared by all its tokens.
#[derive(Debug, Clone, Copy, Default)]
struct SeqRatio {
    pg: f32,
    g: f32,
    clipped: f32,
}

/// PPO-clip of one ratio `r` with advantage `a`: `(pg, ∂pg/∂log r, clipped)`.
fn clipped_term(r: f32, a: f32, cfg: &PolicyLossConfig) -> (f32, f32, f32) {
    let rc = r.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let (s1, s2) = (r * a, rc * a);
    if s1 <= s2 {
        (-s1, -a * r, 0.0)
    } else {
        (-s2, 0.0, 1.0)
    }
}

/// The sequence ratio of every sequence (rows of `t` tokens), from the new logprobs.
fn sequence_ratios(
    lp: &[f32],
    t: usize,
    counted: &dyn Fn(usize) -> f32,
    advantages: &[f32],
    old: &[f32],
    cfg: &PolicyLossConfig,
) -> Vec<SeqRatio> {
    (0..lp.len() / t)
        .map(|b| {
            let (mut n, mut dl, mut a) = (0f64, 0f64, 0f64);
            for i in b * t..(b + 1) * t {
                let m = f64::from(counted(i));
                n += m;
                dl += m * f64::from(lp[i] - old[i]);
                a += m * f64::from(advantages[i]);
            }
            if n == 0.0 {
                return SeqRatio::default();
            }
            let s = (dl / n).exp() as f32;
            let (pg, g, clipped) = clipped_term(s, (a / n) as f32, cfg);
            SeqRatio { pg, g, clipped }
        })
        .collect()
}

/// The per-sequence denominator `w_i = mask_i / den_b` of each sequence, given the batch's
/// normaliser `z` of the aggregation (see [`apply_loss`]).
fn denominators(
    n: usize,
    t: usize,
    counted: &dyn Fn(usize) -> f32,
    aggregation: Aggregation,
    z: f32,
) -> Vec<f32> {
    (0..n / t)
        .map(|b| match aggregation {
            Aggregation::SequenceMean => {
                let nb: f32 = (b * t..(b + 1) * t).map(counted).sum();
                if nb > 0.0 { nb * z } else { 1.0 }
            }
            Aggregation::TokenMean | Aggregation::ConstantLength(_) => z,
        })
        .collect()
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

/// One loss evaluation's checked inputs and batch-wide figures (normaliser, per-sequence
/// denominators, sequence ratios): what [`apply_loss`] over full logits and the chunked head
/// ([`crate::head`]) share, so both compute every row the same way.
pub(crate) struct LossTerms<'l, 'a> {
    loss: &'l Loss<'a>,
    tokens: &'l [u32],
    mask: &'l [f32],
    t: usize,
    aggregation: Aggregation,
    z: f32,
    den: Vec<f32>,
    seq_ratios: Option<Vec<SeqRatio>>,
}

impl<'l, 'a> LossTerms<'l, 'a> {
    /// Checks the inputs (see [`apply_loss`]) and computes the normaliser and denominators.
    pub(crate) fn new(
        vocab: usize,
        tokens: &'l [u32],
        t: usize,
        mask: &'l [f32],
        loss: &'l Loss<'a>,
        normalizer: Option<f32>,
    ) -> Result<Self> {
        let n = tokens.len();
        let bad = |m: String| Err(NativeError::Input(m));
        if t == 0 || !n.is_multiple_of(t) || mask.len() != n {
            return bad(format!(
                "loss inputs disagree: {n} tokens, T={t}, {} mask entries",
                mask.len()
            ));
        }
        if let Some(bad_tok) = tokens.iter().find(|&&x| x as usize >= vocab) {
            return bad(format!(
                "token id {bad_tok} is out of range for vocab {vocab}"
            ));
        }
        let mut aggregation = Aggregation::TokenMean;
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
            if let Aggregation::ConstantLength(c) = cfg.aggregation
                && !(c > 0.0 && c.is_finite())
            {
                return bad(format!(
                    "the constant-length aggregation needs a length > 0 (got {c})"
                ));
            }
            aggregation = cfg.aggregation;
        }
        let counted = |i: usize| if i.is_multiple_of(t) { 0.0 } else { mask[i] };
        let z: f32 = normalizer.unwrap_or_else(|| match aggregation {
            Aggregation::TokenMean => (0..n).map(counted).sum(),
            Aggregation::SequenceMean => (n / t) as f32,
            Aggregation::ConstantLength(c) => (n / t) as f32 * c,
        });
        let z = if z > 0.0 { z } else { 1.0 };
        let den = denominators(n, t, &counted, aggregation, z);
        Ok(LossTerms {
            loss,
            tokens,
            mask,
            t,
            aggregation,
            z,
            den,
            seq_ratios: None,
        })
    }

    /// Whether every logprob of a sequence is needed before any of its gradients (the
    /// sequence ratio): then [`set_logprobs`](Self::set_logprobs) must come first.
    pub(crate) fn needs_all_logprobs(&self) -> bool {
        matches!(self.loss, Loss::Policy { cfg, .. } if cfg.ratio == RatioLevel::Sequence)
    }

    /// Computes the sequence ratios from the token-aligned new logprobs (counted entries
    /// are read).
    pub(crate) fn set_logprobs(&mut self, lp: &[f32]) {
        if let Loss::Policy {
            cfg,
            advantages,
            old_logprobs,
            ..
        } = self.loss
            && cfg.ratio == RatioLevel::Sequence
        {
            let (t, mask) = (self.t, self.mask);
            let counted = |i: usize| if i.is_multiple_of(t) { 0.0 } else { mask[i] };
            self.seq_ratios = Some(sequence_ratios(
                lp,
                t,
                &counted,
                advantages,
                old_logprobs,
                cfg,
            ));
        }
    }

    /// Row `row` of the logits `lg` (it predicts token `row + 1` of the same sequence):
    /// its logprob (`None` when it predicts nothing) and its terms `[m·ℓ, m, m·kl,
    /// m·clipped, −m·lp]`; with `grad` the logits are overwritten with `∂L/∂logits` (zeros
    /// for a row that carries no loss).
    pub(crate) fn row(&self, lg: &mut [f32], row: usize, grad: bool) -> (Option<f32>, [f64; 5]) {
        let (n, t, mask) = (self.tokens.len(), self.t, self.mask);
        let i = row + 1; // token index this row predicts
        if i.is_multiple_of(t) || i >= n {
            if grad {
                lg.fill(0.0);
            }
            return (None, [0.0; 5]);
        }
        let m = mask[i];
        let tok = self.tokens[i] as usize;
        let lse64 = crate::sampling::log_sum_exp(lg);
        let lse = lse64 as f32;
        let lp = (f64::from(lg[tok]) - lse64) as f32;
        if m == 0.0 || !grad {
            if grad {
                lg.fill(0.0);
            }
            return (Some(lp), [0.0; 5]);
        }
        let (val, dlp, kl, clipped) = match self.loss {
            Loss::Sft => (-lp, -1.0, 0.0, 0.0),
            Loss::Policy {
                cfg,
                advantages,
                old_logprobs,
                ref_logprobs,
            } => {
                let (pg, mut g, clipped) = match &self.seq_ratios {
                    Some(sr) => {
                        let s = sr[i / t];
                        (s.pg, s.g, s.clipped)
                    }
                    None => clipped_term((lp - old_logprobs[i]).exp(), advantages[i], cfg),
                };
                let mut val = pg;
                let mut kl = 0.0;
                if let Some(rf) = ref_logprobs {
                    let dlt = rf[i] - lp;
                    let (k, dk) = match cfg.kl {
                        KlEstimator::K3 => (dlt.exp() - dlt - 1.0, 1.0 - dlt.exp()),
                        KlEstimator::K1 => (-dlt, 1.0),
                    };
                    kl = k;
                    if cfg.kl_coef > 0.0 {
                        val += cfg.kl_coef * k;
                        g += cfg.kl_coef * dk;
                    }
                }
                (val, g, kl, clipped)
            }
        };
        // ∂L/∂logit_v = (m/den) · dlp · (onehot_v − softmax_v)
        let coef = m / self.den[i / t] * dlp;
        for x in lg.iter_mut() {
            *x = -coef * (*x - lse).exp();
        }
        lg[tok] += coef;
        (
            Some(lp),
            [
                (m * val) as f64,
                m as f64,
                (m * kl) as f64,
                (m * clipped) as f64,
                (-m * lp) as f64,
            ],
        )
    }

    /// The statistics from every row's terms (`per_row[r]` of row `r`, `[B·T]` of them).
    pub(crate) fn finish(&self, per_row: &[[f64; 5]]) -> LossStats {
        let mut acc = [0f64; 5];
        for r in per_row {
            for (a, b) in acc.iter_mut().zip(r) {
                *a += b;
            }
        }
        let loss = match self.aggregation {
            Aggregation::SequenceMean => per_row
                .chunks(self.t)
                .zip(&self.den)
                .map(|(rows, &d)| rows.iter().map(|r| r[0]).sum::<f64>() / f64::from(d))
                .sum(),
            Aggregation::TokenMean | Aggregation::ConstantLength(_) => acc[0] / self.z as f64,
        };
        let tok = acc[1].max(1e-12);
        LossStats {
            loss,
            tokens: acc[1],
            kl: acc[2] / tok,
            clip_frac: acc[3] / tok,
            nll: acc[4] / tok,
        }
    }
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
