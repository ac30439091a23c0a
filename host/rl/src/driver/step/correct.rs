//! The off-policy correction of a step's batch (`[algorithm] correction`, see
//! [`Correction`]): the trainer's logprobs of the batch with its weights before the step
//! (the proximal policy) become the PPO ratio's denominator, and each token's advantage is
//! weighted by `w = π_prox / π_behav` (the engine's logprobs are the behaviour policy's),
//! truncated at `is_cap` with `tis`. Since `w > 0`, weighting the advantage is weighting the
//! clipped objective: `w · min(r·A, clip(r)·A) = min(r·(wA), clip(r)·(wA))`, so every trainer
//! that takes per-token advantages trains it unchanged.

use crate::algorithm::Trained;
use crate::config::Correction;
use crate::driver::Loop;
use crate::error::RlError;
use crate::metrics::StepMetrics;
use tandem_plugin_api::{RVec, TokenAdvantages, TrainBatch, WhichWeights};

/// What the correction did to a batch's tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Weighed {
    /// Mean of `π_prox / π_behav` over the tokens, before the cap.
    pub mean: f64,
    /// Share of the tokens whose weight the cap held.
    pub clipped: f64,
}

impl Loop<'_> {
    /// Corrects `trained` for the policy that generated it (nothing with `correction =
    /// "none"`); its figures go into `m`.
    pub(in crate::driver) fn correct(
        &self,
        trained: &mut Trained,
        m: &mut StepMetrics,
    ) -> Result<(), RlError> {
        let a = &self.plan.algorithm;
        let correction = a.correction();
        if correction == Correction::None || trained.batch.sequences.is_empty() {
            return Ok(());
        }
        let prox = self
            .trainer
            .remote
            .compute_logprobs(trained.batch.clone(), WhichWeights::Current)?;
        let cap = (correction == Correction::Tis).then_some(a.is_cap);
        let (rows, w) = weigh(&mut trained.batch, &prox, trained.advantages.as_ref(), cap)?;
        trained.advantages = Some(TokenAdvantages { rows });
        m.is_weight_mean = Some(w.mean);
        m.is_clipped_frac = cap.map(|_| w.clipped);
        Ok(())
    }
}

/// Sets every sequence's `old_logprobs` to its proximal logprobs `prox` and returns each
/// completion token's advantage (`advantages`' or its sequence's) times `π_prox / π_behav`
/// (at most `cap`), with the weights' figures.
pub(crate) fn weigh(
    batch: &mut TrainBatch,
    prox: &[Vec<f32>],
    advantages: Option<&TokenAdvantages>,
    cap: Option<f32>,
) -> Result<(RVec<RVec<f32>>, Weighed), RlError> {
    if prox.len() != batch.sequences.len() {
        return Err(RlError::failed(format!(
            "the trainer returned logprobs for {} sequences of {}",
            prox.len(),
            batch.sequences.len()
        )));
    }
    let (mut sum, mut clipped, mut tokens) = (0f64, 0u64, 0u64);
    let mut rows = Vec::with_capacity(prox.len());
    for (i, (seq, prox)) in batch.sequences.iter_mut().zip(prox).enumerate() {
        let behav = &seq.old_logprobs;
        let given = advantages.and_then(|a| a.rows.get(i));
        if behav.len() != prox.len() || given.is_some_and(|g| g.len() != prox.len()) {
            return Err(RlError::failed(format!(
                "sequence {i}: {} behaviour logprobs, {} proximal, {} advantages",
                behav.len(),
                prox.len(),
                given.map_or(prox.len(), |g| g.len())
            )));
        }
        let mut row = Vec::with_capacity(prox.len());
        for (j, (&p, &b)) in prox.iter().zip(behav.iter()).enumerate() {
            let w = (p - b).exp();
            sum += f64::from(w);
            tokens += 1;
            let held = match cap {
                Some(c) if w > c => {
                    clipped += 1;
                    c
                }
                _ => w,
            };
            let adv = given.map_or(seq.advantage, |g| g[j]);
            row.push(adv * held);
        }
        seq.old_logprobs = RVec::from(prox.clone());
        rows.push(RVec::from(row));
    }
    let n = tokens.max(1) as f64;
    let figures = Weighed {
        mean: sum / n,
        clipped: clipped as f64 / n,
    };
    Ok((RVec::from(rows), figures))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::algorithm::grpo;
    use tandem_plugin_api::TrainSequence;

    fn batch(seqs: &[(f32, &[f32])]) -> TrainBatch {
        let sequences = seqs
            .iter()
            .map(|(adv, behav)| TrainSequence {
                tokens: RVec::from(vec![1u32; 2 + behav.len()]),
                prompt_len: 2,
                advantage: *adv,
                old_logprobs: RVec::from(behav.to_vec()),
                ref_logprobs: RVec::new(),
            })
            .collect::<Vec<_>>();
        TrainBatch {
            sequences: RVec::from(sequences),
            loss: grpo::loss(1e-3, 0.2, 0.0, 1.0),
        }
    }

    /// Hand-computed: weights `exp(prox − behav)`, the cap, the ratio's new denominator.
    #[test]
    fn tokens_are_weighted_by_the_proximal_over_the_behaviour_policy() {
        let mut b = batch(&[(2.0, &[-1.0, -2.0]), (-1.0, &[-0.5])]);
        let prox = vec![vec![-1.0, -2.0 + 3f32.ln()], vec![-0.5 + 0.5f32.ln()]];
        let (rows, w) = weigh(&mut b, &prox, None, Some(2.0)).unwrap();
        let got: Vec<Vec<f32>> = rows.iter().map(|r| r.to_vec()).collect();
        // Sequence 0: weights 1 and 3 (capped at 2); sequence 1: weight 0.5.
        let want = [vec![2.0, 4.0], vec![-0.5]];
        for (g, w) in got.iter().zip(&want) {
            for (x, y) in g.iter().zip(w) {
                assert!((x - y).abs() < 1e-5, "{got:?} vs {want:?}");
            }
        }
        assert!((w.mean - (1.0 + 3.0 + 0.5) / 3.0).abs() < 1e-5, "{w:?}");
        assert!((w.clipped - 1.0 / 3.0).abs() < 1e-9, "{w:?}");
        assert_eq!(b.sequences[0].old_logprobs.to_vec(), prox[0]);
        assert_eq!(b.sequences[1].old_logprobs.to_vec(), prox[1]);
    }

    /// Without a cap the weights go through whole; per-token advantages are weighted too.
    #[test]
    fn decoupled_weights_are_not_capped_and_token_advantages_are_kept() {
        let mut b = batch(&[(0.0, &[-1.0, -1.0])]);
        let prox = vec![vec![-1.0 + 4f32.ln(), -1.0]];
        let given = TokenAdvantages {
            rows: RVec::from(vec![RVec::from(vec![0.5f32, -2.0])]),
        };
        let (rows, w) = weigh(&mut b, &prox, Some(&given), None).unwrap();
        let row = rows[0].to_vec();
        assert!(
            (row[0] - 2.0).abs() < 1e-5 && (row[1] + 2.0).abs() < 1e-6,
            "{row:?}"
        );
        assert_eq!(w.clipped, 0.0);
    }

    /// Logprobs that do not line up with the batch are an error, not a silent mix.
    #[test]
    fn mismatched_logprobs_are_an_error() {
        let mut b = batch(&[(1.0, &[-1.0, -1.0])]);
        assert!(weigh(&mut b, &[vec![-1.0]], None, None).is_err());
        assert!(weigh(&mut b, &[], None, None).is_err());
    }
}
