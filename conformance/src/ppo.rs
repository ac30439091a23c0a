//! The trainer checks of PPO's calls (API level 5): a trainer whose `describe_config`
//! answers `value_model` values every completion token and learns its returns; one that
//! answers `token_advantages` steps with per-token advantages equal to each sequence's
//! exactly as `train_step_policy`. A trainer that does not say so answers `NotSupported`.

use crate::expect::{not_supported, ok};
use crate::harness::{Failure, Outcome};
use crate::trainer::{TrainerHarness, metric_bits};
use tandem_plugin_api::{
    Metric, PolicyLoss, RVec, TokenAdvantages, TrainBatch, ValueTargets, WhichWeights,
};

/// The completion length of every sequence of `batch`.
fn completion_lens(batch: &TrainBatch) -> Vec<usize> {
    batch
        .sequences
        .iter()
        .map(|s| s.tokens.len() - s.prompt_len as usize)
        .collect()
}

/// A named metric of a step (NaN when absent).
fn metric(m: &[Metric], name: &str) -> f64 {
    m.iter()
        .find(|x| x.name.as_str() == name)
        .map_or(f64::NAN, |x| x.value)
}

/// The PPO checks.
pub mod checks {
    use super::*;

    /// `value_model`: `compute_values` gives one finite value per completion token of every
    /// sequence, and a few `train_step_value` steps toward fixed returns report a finite
    /// `value_loss` that ends below where it began.
    pub fn value_model_as_declared(h: &mut TrainerHarness) -> Outcome {
        let rule = "a value model values every completion token and learns its returns";
        let batch = h.batch(None);
        if !h.config_caps.as_ref().is_some_and(|c| c.value_model) {
            return not_supported(
                h.trainer.compute_values(batch),
                "compute_values (value_model not declared)",
            );
        }
        // The harness's trainer is shared by the checks: it leaves as it came.
        ok(
            h.trainer.snapshot("conformance-value".into()),
            rule,
            "snapshot",
        )?;
        let checked = values_and_steps(h, rule, &batch);
        ok(
            h.trainer.restore("conformance-value".into()),
            rule,
            "restore",
        )?;
        checked
    }

    /// `compute_values` and four value steps of [`value_model_as_declared`].
    fn values_and_steps(h: &mut TrainerHarness, rule: &'static str, batch: &TrainBatch) -> Outcome {
        let lens = completion_lens(batch);
        let values = ok(
            h.trainer.compute_values(batch.clone()),
            rule,
            "compute_values",
        )?;
        let got: Vec<usize> = values.iter().map(|r| r.len()).collect();
        if got != lens || values.iter().flatten().any(|v| !v.is_finite()) {
            return Err(Failure::new(
                rule,
                format!(
                    "compute_values gave rows of {got:?} (finite?) for completions of {lens:?}"
                ),
            ));
        }
        let returns: RVec<RVec<f32>> = lens.iter().map(|&n| vec![1.0f32; n].into()).collect();
        let targets = ValueTargets {
            returns,
            old_values: RVec::new(),
            clip: 0.0,
        };
        let mut losses = Vec::new();
        for _ in 0..4 {
            let m = ok(
                h.trainer.train_step_value(batch.clone(), targets.clone()),
                rule,
                "train_step_value",
            )?;
            losses.push(metric(&m, "value_loss"));
        }
        let (first, last) = (losses[0], losses[losses.len() - 1]);
        if !losses.iter().all(|l| l.is_finite()) || last >= first {
            return Err(Failure::new(
                rule,
                format!("value_loss over 4 steps toward returns of 1: {losses:?}"),
            ));
        }
        Ok(())
    }

    /// `token_advantages`: from one snapshot, `train_step_advantages` with each sequence's
    /// advantage on every one of its tokens reports what `train_step_policy` reports and
    /// leaves the same weights, bit for bit.
    pub fn token_advantages_as_declared(h: &mut TrainerHarness) -> Outcome {
        let rule = "per-token advantages equal to the sequence's are train_step_policy";
        let old = ok(
            h.trainer
                .compute_logprobs(h.batch(None), WhichWeights::Current),
            rule,
            "compute_logprobs",
        )?;
        let batch = h.batch(Some(&old));
        let rows = TokenAdvantages {
            rows: batch
                .sequences
                .iter()
                .map(|s| vec![s.advantage; s.tokens.len() - s.prompt_len as usize].into())
                .collect(),
        };
        let loss = PolicyLoss::default();
        if !h.config_caps.as_ref().is_some_and(|c| c.token_advantages) {
            return not_supported(
                h.trainer.train_step_advantages(batch, loss, rows),
                "train_step_advantages (token_advantages not declared)",
            );
        }
        ok(
            h.trainer.snapshot("conformance-ppo".into()),
            rule,
            "snapshot",
        )?;
        let sequence = ok(
            h.trainer.train_step_policy(batch.clone(), loss),
            rule,
            "train_step_policy",
        )?;
        let after_sequence = h.logprobs(rule)?;
        ok(h.trainer.restore("conformance-ppo".into()), rule, "restore")?;
        let token = ok(
            h.trainer.train_step_advantages(batch, loss, rows),
            rule,
            "train_step_advantages",
        )?;
        let after_token = h.logprobs(rule)?;
        let (sequence, token) = (metric_bits(&sequence), metric_bits(&token));
        if sequence != token {
            return Err(Failure::new(
                rule,
                format!("train_step_policy reported {sequence:?}, train_step_advantages {token:?}"),
            ));
        }
        if after_sequence != after_token {
            return Err(Failure::new(
                rule,
                "the weights after train_step_advantages differ from train_step_policy's",
            ));
        }
        Ok(())
    }
}
