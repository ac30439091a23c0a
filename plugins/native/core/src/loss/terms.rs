//! [`LossTerms`]: one loss evaluation's checked inputs, batch-wide figures and per-row code
//! (the definition in the parent module's doc), shared by [`super::apply_loss`] over full
//! logits and the chunked head ([`crate::head`]).

use super::{Aggregation, KlEstimator, Loss, LossStats, PolicyLossConfig, RatioLevel};
use crate::error::{NativeError, Result};

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
