//! A drafter-training job (`[algorithm] name = "drafter"`, see `[drafter]`): TorchSpec's job,
//! step-serialised as in its colocation design. The model is fixed (the *target*); the
//! trainer component trains a speculative-decoding drafter on the target's hidden states.
//!
//! One step:
//! 1. **generate** — the environment's prompts (`group_size` completions each), whole prompts per
//!    engine rank, engines in parallel;
//! 2. **features + train** — engine rank `i` computes the hidden states of its sequences
//!    (the layers the trainer's drafter reads) and sends them over transport group `pair{i}`
//!    straight into the trainer's preallocated receive region, while the trainer takes one
//!    optimiser step on all of them (`train_step_features`). Only metadata travels on the
//!    control plane: the step (the message tag), token ids, prompt lengths, row counts. With
//!    `[drafter] route = "control"` the features go through the controller instead (for
//!    comparison);
//! 3. **eval** — before the first step (the untrained drafter: this also loads the drafter
//!    into every engine and grows their speculative scratch, so no step allocates), every
//!    `eval_every` steps and after the last: the trainer exports the drafter
//!    as a directory, every engine loads it (`load_drafter`) and decodes the held-out prompts
//!    greedily with it; the mean acceptance length is the engines' emitted tokens per
//!    verification round over that decode;
//! 4. **save** — every `save_every` steps and at the end, the drafter checkpoint;
//! 5. **record** — the step's `metrics.jsonl` line (drafter loss, accuracy per draft
//!    position, transfer bytes and time, acceptance length, worker RSS and memory ledger),
//!    progress, and `plot.png` every 10 steps.
//!
//! The transport world: the trainer is world rank 0, engine rank `i` world rank `1 + i`;
//! group `pair{i}` is `[engine i, trainer]` (so the engine is rank 0 and the trainer rank 1
//! of it). The controller hosts the rendezvous store; workers join it in the background as
//! they start.

mod launch;
mod metrics;
mod plot;
mod step;

use crate::config::{DrafterJobPlan, RunPlan};
use crate::driver::RunOptions;
use crate::driver::rundir::RunFiles;
use crate::env::Env;
use crate::error::RlError;
use crate::events::EventLog;
use crate::progress::Progress;
use crate::prompt::PromptCodec;
use metrics::DrafterMetricsLog;
use std::path::PathBuf;
use tandem_runtime::launch::{LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_runtime::registry::Registry;

pub use metrics::DrafterStepMetrics;

pub(crate) use launch::drafter_inputs;

/// What a finished drafter job reports.
#[derive(Debug, Clone)]
pub struct DrafterSummary {
    /// Last step run.
    pub last_step: u32,
    /// Drafter loss of the first step.
    pub first_loss: f64,
    /// Mean drafter loss over the last few steps.
    pub final_loss: f64,
    /// Step and mean acceptance length of the first measurement.
    pub first_acceptance: Option<(u32, f64)>,
    /// Step and mean acceptance length of the last measurement.
    pub last_acceptance: Option<(u32, f64)>,
    /// The run directory.
    pub run_dir: PathBuf,
    /// The newest drafter checkpoint.
    pub checkpoint: Option<PathBuf>,
}

/// Runs a drafter job validated by [`crate::config::validate_with`].
pub fn run(
    plan: &RunPlan,
    registry: &Registry,
    opts: RunOptions,
) -> Result<DrafterSummary, RlError> {
    if opts.resume {
        return Err(RlError::usage(format!(
            "--resume {}: a drafter job does not resume",
            opts.run_dir.display()
        ))
        .with_help("start a new run; point [trainer.options] drafter at a saved drafter checkpoint to continue from it"));
    }
    crate::driver::skeleton::execute(DrafterLoop::launch(plan, registry, &opts)?, plan, &opts)
}

impl crate::driver::skeleton::Job for DrafterLoop<'_> {
    type Summary = DrafterSummary;

    fn steps(&self) -> (u32, u32) {
        (1, self.total)
    }

    fn before(&mut self) -> Result<(), RlError> {
        self.step_zero()
    }

    fn step(&mut self, step: u32) -> Result<(), RlError> {
        DrafterLoop::step(self, step, self.total)
    }

    fn finish(&mut self) -> DrafterSummary {
        DrafterLoop::finish(self, self.total)
    }

    fn events(&self) -> &EventLog {
        &self.events
    }

    fn say(&self, line: &str) {
        self.progress.println(line);
    }

    fn checkpoint(&self) -> Option<std::path::PathBuf> {
        self.last_checkpoint.clone()
    }

    fn shutdown(self) -> Result<(), RlError> {
        Ok(self
            .launcher
            .shutdown(crate::driver::skeleton::SHUTDOWN_GRACE)?)
    }
}

/// A drafter job in progress.
struct DrafterLoop<'a> {
    plan: &'a RunPlan,
    /// The drafter job's settings (`plan.drafter.job`).
    settings: &'a DrafterJobPlan,
    opts: &'a RunOptions,
    env: Env,
    codec: PromptCodec,
    held_out: Vec<Vec<u32>>,
    launcher: LocalLauncher,
    /// Kept alive for the workers' rendezvous.
    _world: crate::driver::world::World,
    engines: Vec<RemoteEngine>,
    trainer: RemoteTrainer,
    /// The layers the drafter reads and the width of a feature row.
    layers: Vec<u32>,
    width: u32,
    events: EventLog,
    metrics: DrafterMetricsLog,
    progress: Progress,
    files: RunFiles,
    data_position: u64,
    last_checkpoint: Option<PathBuf>,
    /// The last step.
    total: u32,
}

impl DrafterLoop<'_> {
    /// The job's summary after its last step.
    fn finish(&self, total: u32) -> DrafterSummary {
        self.progress.finish();
        let steps = &self.metrics.steps;
        let trained: Vec<&DrafterStepMetrics> = steps.iter().filter(|m| m.step > 0).collect();
        let first_loss = trained.first().map_or(f64::NAN, |m| m.loss);
        let tail: Vec<f64> = trained.iter().rev().take(5).map(|m| m.loss).collect();
        let final_loss = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
        let acceptance: Vec<(u32, f64)> = steps
            .iter()
            .filter_map(|m| m.acceptance_length.map(|a| (m.step, a)))
            .collect();
        DrafterSummary {
            last_step: total,
            first_loss,
            final_loss,
            first_acceptance: acceptance.first().copied(),
            last_acceptance: acceptance.last().copied(),
            run_dir: self.opts.run_dir.clone(),
            checkpoint: self.last_checkpoint.clone(),
        }
    }
}
