//! One RL step as a sequence of phases: rollout → drained offload → train → save → staged
//! onload with the sync (`onload.rs`) → eval on the steps `[eval]` names (`eval.rs`) →
//! record (`record.rs`). Each phase is a method of
//! [`Loop`]; what a step measures on the way travels in a [`StepLog`].

use super::record::StepLog;
use super::{Loop, timed};
use crate::checkpoint::{self, LoopState};
use crate::error::RlError;
use crate::grpo;
use crate::metrics::{StepMetrics, rss_bytes};
use crate::rollout::{self, Rollout, RolloutSpec};
use tandem_plugin_api::{Metric, TrainBatch, WhichWeights};

impl Loop<'_> {
    /// Runs step `step`.
    pub(super) fn step(&mut self, step: u32) -> Result<(), RlError> {
        let mut log = StepLog::new(step);
        let rollout = self.rollout(&mut log)?;
        self.drained_offload(&mut log)?;
        let batch = self.batch(&rollout, &mut log);
        let before = self.cursor.weight_version;
        self.train(batch, &mut log)?;
        self.save(&mut log)?;
        let sync = self.cursor.weight_version != before;
        let record = self.staged_onload(step, sync, &mut log.phases)?;
        if self.eval_due(step) {
            let result = timed(&mut log.phases, "eval", || self.evaluate(step))?;
            log.metrics.set_eval(&result);
        }
        self.record(log, record.as_ref())
    }

    /// Generates whole GRPO groups on every engine, from the current data position on.
    fn rollout(&mut self, log: &mut StepLog) -> Result<Rollout, RlError> {
        let (a, seed) = (&self.job.algorithm, self.job.run.seed);
        let spec = RolloutSpec {
            first_problem: self.cursor.data_position,
            prompts: a.prompts_per_step,
            group_size: a.group_size,
            max_tokens: a.max_tokens,
            temperature: a.temperature,
            seed: seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ u64::from(log.step),
            adapter: self.bridge.request_adapter(),
        };
        let rollout = timed(&mut log.phases, "generate", || {
            rollout::run(
                &spec,
                &self.engines.remotes,
                self.task.as_ref(),
                &self.codec,
            )
        })?;
        self.cursor.data_position += u64::from(a.prompts_per_step);
        Ok(rollout)
    }

    /// Pause all → flush all → release all; then the engines' resident memory, where it is
    /// comparable step to step (what a leak would grow). What the regions hold is in the
    /// ledger figures.
    fn drained_offload(&mut self, log: &mut StepLog) -> Result<(), RlError> {
        timed(&mut log.phases, "offload", || {
            self.engines.drained_offload(&self.events, log.step)
        })?;
        for (rank, e) in self.engines.remotes.iter().enumerate() {
            log.rss.insert(format!("engine-{rank}"), rss_bytes(e.pid()));
        }
        Ok(())
    }

    /// Group-relative advantages → the train batch (written to `rollouts.jsonl` too with
    /// `[run] dump_rollouts`); the rollout's figures go to the step's metrics.
    fn batch(&self, rollout: &Rollout, log: &mut StepLog) -> TrainBatch {
        let a = &self.job.algorithm;
        let adv = grpo::advantages(&rollout.samples);
        if self.job.run.dump_rollouts {
            super::dump::append(&self.files.rollouts, log.step, rollout, &adv, &self.codec);
        }
        let loss = grpo::loss(a.learning_rate, a.clip_eps, a.kl_coef, a.grad_clip);
        let batch = grpo::batch(&rollout.samples, &adv, loss, a.kl_coef > 0.0);
        log.rollout_figures(rollout);
        log.metrics.train_sequences = batch.sequences.len() as u64;
        batch
    }

    /// Onload the trainer → `ref` logprobs (with a KL penalty) → GRPO steps → snapshot
    /// `actor`; nothing but the onload when no sequence carries signal.
    fn train(&mut self, batch: TrainBatch, log: &mut StepLog) -> Result<(), RlError> {
        let step = log.step;
        let m = &mut log.metrics;
        timed(&mut log.phases, "train", || {
            self.trainer.onload(step, &self.events)?;
            if batch.sequences.is_empty() {
                return Ok(());
            }
            self.optimise(batch, step, m)
        })
    }

    fn optimise(
        &mut self,
        mut batch: TrainBatch,
        step: u32,
        m: &mut StepMetrics,
    ) -> Result<(), RlError> {
        let a = &self.job.algorithm;
        let trainer = &self.trainer.remote;
        if a.kl_coef > 0.0 {
            let refs =
                trainer.compute_logprobs(batch.clone(), WhichWeights::Snapshot("ref".into()))?;
            for (s, r) in batch.sequences.iter_mut().zip(refs) {
                s.ref_logprobs = r.into();
            }
            self.events.record(step, "trainer", "ref_logprobs", "");
        }
        for _ in 0..a.train_steps_per_rollout.max(1) {
            let out = trainer.train_step(batch.clone())?;
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

    /// A checkpoint every `save_every` steps and at the last step, with the loop state and
    /// what the step measured so far.
    fn save(&mut self, log: &mut StepLog) -> Result<(), RlError> {
        let (step, every) = (log.step, self.job.run.save_every);
        if !((every > 0 && step % every == 0) || step == self.cursor.total_steps) {
            return Ok(());
        }
        let state = LoopState {
            step,
            data_position: self.cursor.data_position,
            weight_version: self.cursor.weight_version,
        };
        let partial = StepMetrics {
            phases: log.phases.clone(),
            weight_version: self.cursor.weight_version,
            ..log.metrics.clone()
        };
        let dir = timed(&mut log.phases, "save", || {
            let trainer = &self.trainer.remote;
            checkpoint::save(&self.opts.run_dir, trainer, self.model, &state, &partial)
        })?;
        self.events
            .record(step, "trainer", "checkpoint", &dir.display().to_string());
        self.last_checkpoint = Some(dir);
        Ok(())
    }
}

/// A named figure of a train step's output (NaN when absent).
fn metric(m: &[Metric], name: &str) -> f64 {
    m.iter()
        .find(|x| x.name.as_str() == name)
        .map(|x| x.value)
        .unwrap_or(f64::NAN)
}
