//! GRPO's part of a step: dynamic sampling's later rounds (`[algorithm] dynamic_sampling`),
//! the `ref` logprobs of the samples when the KL goes into the rewards (`kl_in =
//! "reward"`), the advantages and the train batch, and the optimiser steps on it (the
//! loss variant `[algorithm]` names through `train_step_policy`).

use super::StepState;
use crate::algorithm::grpo::{self, Sample};
use crate::algorithm::{StepCx, Trained};
use crate::config::KlIn;
use crate::driver::record::StepLog;
use crate::driver::{Loop, dump, spec, timed};
use crate::error::RlError;
use crate::metrics::StepMetrics;
use crate::rollout::{self, Rollout};
use tandem_plugin_api::{Metric, WhichWeights};

impl Loop<'_> {
    /// Dynamic sampling's later rounds: as many of the task's next problems as groups with
    /// signal are still missing, whole groups per engine, until enough carry signal or the
    /// rounds are spent. Each round moves the data position on by its problems once it is
    /// in; a round an engine failed is asked again of the missing engines only. Then the
    /// step's rollout: every sample, and those trained on.
    pub(super) fn more_rounds(&mut self, s: &mut StepState) -> Result<(), RlError> {
        while let Some(prompts) = s.sampling.next_round() {
            if s.pending.is_none() {
                s.spec.first_problem = self.cursor.data_position;
                s.spec.prompts = prompts;
                s.spec.seed = round_seed(s.seed, s.sampling.rounds);
                s.spec.adapter = self.bridge.request_adapter();
                s.spec.version = self.served();
                s.pending = Some(rollout::Pending::new(
                    &s.spec,
                    self.engines.remotes.len(),
                    &self.env,
                    &self.codec,
                )?);
            }
            let pending = s
                .pending
                .as_mut()
                .ok_or_else(|| RlError::failed("no pending rollout"))?;
            let engines = &self.engines.remotes;
            let before = spec::read(engines);
            let generated = timed(&mut s.log.phases, "generate", || {
                pending
                    .generate(&s.spec, engines, &self.codec, &|_, _, _| {})
                    .map_err(|(_, e)| e)
            });
            s.speculated.add(&before, &spec::read(engines));
            generated?;
            let done = s
                .pending
                .take()
                .ok_or_else(|| RlError::failed("no pending rollout"))?;
            s.sampling
                .add(done.finish(&s.spec, &self.env, &self.codec)?);
            self.cursor.data_position += u64::from(prompts);
        }
        if let Some((tokens, len)) = s.speculated.figures() {
            s.log.metrics.spec_tokens = Some(tokens);
            s.log.metrics.acceptance_length = len;
        }
        let sampling = std::mem::take(&mut s.sampling);
        if sampling.dynamic() {
            let m = &mut s.log.metrics;
            m.sampling_rounds = Some(sampling.rounds);
            m.groups_kept = Some(sampling.kept() as u32);
            m.groups_dropped = Some(sampling.dropped as u32);
        }
        let (rollout, train) = sampling.finish();
        self.reward_failures(s.log.step, &rollout)?;
        s.rollout = Some((rollout, train));
        Ok(())
    }

    /// The algorithm's advantages of the samples trained on (`train`: with `kl_in =
    /// "reward"`, of their rewards less the KL to `ref`) → what the actor trains on (every
    /// sample written to `rollouts.jsonl` too with `[run] dump_rollouts`, 0 the advantage of
    /// a dropped group's); the rollout's figures, of every sample, go to the step's metrics.
    pub(super) fn batch(
        &mut self,
        rollout: &Rollout,
        train: &[Sample],
        log: &mut StepLog,
    ) -> Result<Trained, RlError> {
        let plan = self.plan;
        let a = &plan.algorithm;
        let kl_in_reward = a.kl_in == KlIn::Reward && a.kl_coef > 0.0;
        // No sample left to score (every group dropped): nothing asks the reference.
        let rewards = if kl_in_reward && !train.is_empty() {
            let step = log.step;
            let refs = timed(&mut log.phases, "train", || self.reward_refs(train, step))?;
            grpo::kl_penalised(train, &refs, a.kl_coef, a.kl_estimator)
        } else {
            train.iter().map(|s| s.reward).collect()
        };
        let mut cx = StepCx {
            step: log.step,
            events: &self.events,
            metrics: &mut log.metrics,
        };
        let algorithm = &mut self.algorithm;
        let (trained, adv) = timed(&mut log.phases, "advantages", || {
            algorithm.prepare(&mut cx, train, &rewards)
        })?;
        if self.plan.run.dump_rollouts {
            let kept: std::collections::BTreeSet<usize> = train.iter().map(|s| s.group).collect();
            let mut trained = adv.iter();
            let all: Vec<f32> = rollout
                .samples
                .iter()
                .map(|s| match kept.contains(&s.group) {
                    true => trained.next().copied().unwrap_or(0.0),
                    false => 0.0,
                })
                .collect();
            let version = self.cursor.weight_version;
            dump::append(
                &self.files.rollouts,
                log.step,
                rollout,
                &all,
                &self.codec,
                version,
            );
        }
        log.rollout_figures(rollout);
        log.metrics.train_sequences = trained.batch.sequences.len() as u64;
        Ok(trained)
    }

    /// The `ref` logprobs of every sample's completion (empty for an empty completion),
    /// with the trainer onloaded.
    fn reward_refs(&mut self, samples: &[Sample], step: u32) -> Result<Vec<Vec<f32>>, RlError> {
        self.trainer.onload(step, &self.events)?;
        let zeros = vec![0.0; samples.len()];
        let loss = grpo::loss(0.0, 0.0, 0.0, 0.0);
        // Every sample with a completion, in order (the batch leaves out empty ones).
        let batch = grpo::batch(samples, &zeros, loss, true);
        let which = WhichWeights::Snapshot("ref".into());
        let mut rows = self
            .trainer
            .remote
            .compute_logprobs(batch, which)?
            .into_iter();
        self.events
            .record(step, "trainer", "ref_logprobs", "reward");
        Ok(samples
            .iter()
            .map(|s| match s.completion.is_empty() {
                true => Vec::new(),
                false => rows.next().unwrap_or_default(),
            })
            .collect())
    }

    /// `ref` logprobs (with a KL penalty) → the actor's steps → snapshot `actor`.
    pub(in crate::driver) fn optimise(
        &mut self,
        mut trained: Trained,
        step: u32,
        m: &mut StepMetrics,
    ) -> Result<(), RlError> {
        self.correct(&mut trained, m)?;
        let a = &self.plan.algorithm;
        let trainer = &self.trainer.remote;
        // The batch's own KL weight: 0 when the KL went into the rewards.
        let batch = &mut trained.batch;
        if batch.loss.kl_coef > 0.0 {
            let refs =
                trainer.compute_logprobs(batch.clone(), WhichWeights::Snapshot("ref".into()))?;
            for (s, r) in batch.sequences.iter_mut().zip(refs) {
                s.ref_logprobs = r.into();
            }
            self.events.record(step, "trainer", "ref_logprobs", "");
        }
        for _ in 0..a.train_steps_per_rollout.max(1) {
            let out = self.algorithm.actor_step(trainer, &trained)?;
            m.loss = metric(&out, "loss");
            m.kl = metric(&out, "kl");
            m.grad_norm = metric(&out, "grad_norm");
            m.clip_frac = metric(&out, "clip_frac");
            let v = metric(&out, "weight_version");
            if v.is_finite() {
                self.cursor.weight_version = v as u64;
            }
        }
        let version = format!("version {}", self.cursor.weight_version);
        self.events.record(step, "trainer", "train", &version);
        trainer.snapshot("actor")?;
        self.events.record(step, "trainer", "snapshot", "actor");
        Ok(())
    }

    /// The ids of the step's problems (an `environment` event `items`: what `--resume` must
    /// continue with) and each failed sample (`reward_failed`, `id: reason`); the run stops
    /// with one line when more than `[environment] max_failed_frac` of its samples failed.
    fn reward_failures(&self, step: u32, rollout: &Rollout) -> Result<(), RlError> {
        self.events
            .record(step, "environment", "items", &rollout.items.join(" "));
        for (id, reason) in &rollout.failures {
            self.events.record(
                step,
                "environment",
                "reward_failed",
                &format!("{id}: {reason}"),
            );
        }
        let t = &rollout.tally;
        let limit = self.plan.environment.section.max_failed_frac;
        if t.failed == 0 || t.failed_frac() <= limit {
            return Ok(());
        }
        let (reason, count) = t
            .reasons
            .iter()
            .max_by_key(|(_, n)| **n)
            .map_or(("?", 0), |(r, n)| (r.as_str(), *n));
        Err(RlError::failed(format!(
            "step {step}: the rewards of {} of {} samples failed, more than max_failed_frac = \
             {limit} (most often, {count} times: {reason})",
            t.failed, t.samples
        ))
        .with_help(
            "fix the reward (events.jsonl lists every failed sample), give it more time \
             (timeout_s), or raise [environment] max_failed_frac",
        ))
    }
}

/// The seed of a step's rollout round `round` (0 is the first, whose seed is `seed`).
fn round_seed(seed: u64, round: u32) -> u64 {
    seed ^ u64::from(round).wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

/// A named figure of a train step's output (NaN when absent).
fn metric(m: &[Metric], name: &str) -> f64 {
    m.iter()
        .find(|x| x.name.as_str() == name)
        .map(|x| x.value)
        .unwrap_or(f64::NAN)
}
