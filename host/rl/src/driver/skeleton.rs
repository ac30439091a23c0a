//! What every job of `tandem run` shares, whatever it trains: the preparation (the task
//! stream without its held-out problems, the run directory, `--resume`'s checkpoint chosen
//! before anything is written, the model created or checked, the prompt codec, the launcher,
//! the event log) and the run of the steps ([`execute`]: what comes before the first step,
//! every step, the summary, the event log flushed whatever happened, the workers shut down
//! after a run that succeeded), with the run's trackers (`[logging]`) told of every
//! `metrics.jsonl` line and ended with the run.
//!
//! A [`Job`] is what runs on it: the RL loop (`Loop`, whose steps an
//! [`Algorithm`](crate::algorithm::Algorithm) trains) or a drafter job (`drafter`).

use super::RunOptions;
use super::rundir::{self, RunFiles};
use crate::checkpoint::{self, LoopState};
use crate::config::RunPlan;
use crate::env::Env;
use crate::error::RlError;
use crate::events::EventLog;
use crate::prompt::PromptCodec;
use crate::warmstart;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tandem_runtime::launch::LocalLauncher;
use tandem_runtime::registry::Registry;

/// A job's steps, as [`execute`] runs them.
pub(crate) trait Job {
    /// What a finished job reports.
    type Summary;
    /// The first step and the last.
    fn steps(&self) -> (u32, u32);
    /// What comes before the first step (the first evaluation).
    fn before(&mut self) -> Result<(), RlError>;
    /// Runs step `step`.
    fn step(&mut self, step: u32) -> Result<(), RlError>;
    /// The summary after the last step.
    fn finish(&mut self) -> Self::Summary;
    /// The job's event log.
    fn events(&self) -> &EventLog;
    /// Shows a line above the job's progress display.
    fn say(&self, line: &str);
    /// The job's newest checkpoint.
    fn checkpoint(&self) -> Option<PathBuf>;
    /// Shuts the job's workers down (each given [`SHUTDOWN_GRACE`] to exit).
    fn shutdown(self) -> Result<(), RlError>;
}

/// How long a worker may take to exit at the end of a job.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// How long the end of a run waits for its trackers' last backlog.
const TRACKING_GRACE: Duration = Duration::from_secs(120);

/// Runs every step of `job`, telling `plan`'s trackers of every metrics line; the event log
/// is flushed and the trackers ended whatever happened, the workers are shut down after a
/// job that succeeded.
pub(crate) fn execute<J: Job>(
    mut job: J,
    plan: &RunPlan,
    opts: &RunOptions,
) -> Result<J::Summary, RlError> {
    let tracker = start_tracking(plan, opts, job.steps().0)?;
    let told = |job: &J, step: u32| {
        if let Some(t) = &tracker {
            t.notify();
            for w in t.warnings() {
                job.say(&w);
                job.events().record(step, "tracking", "warning", &w);
            }
        }
    };
    let result: Result<J::Summary, RlError> = (|| {
        job.before()?;
        let (first, last) = job.steps();
        told(&job, first.saturating_sub(1));
        for step in first..=last {
            job.step(step)?;
            told(&job, step);
        }
        Ok(job.finish())
    })();
    if let Some(t) = tracker {
        for w in t.finish(job.checkpoint(), result.is_err(), TRACKING_GRACE) {
            job.say(&w);
            job.events()
                .record(job.steps().1, "tracking", "warning", &w);
        }
    }
    job.events().flush();
    let summary = result?;
    job.shutdown()?;
    Ok(summary)
}

/// A job prepared to start its workers.
pub(crate) struct Prepared {
    /// The environment (its training split leaves out the held-out problems).
    pub env: Env,
    /// The prompts' codec.
    pub codec: PromptCodec,
    /// `--resume`: the checkpoint to continue from and its loop state.
    pub resume_from: Option<(PathBuf, LoopState)>,
    /// The launcher of the job's workers.
    pub launcher: LocalLauncher,
    /// The run directory's files.
    pub files: RunFiles,
    /// The event log.
    pub events: EventLog,
}

/// Prepares `plan`'s run: the run directory, the environment (holding out `held_out`
/// problems), the checkpoint `--resume` continues from (chosen before anything is
/// written: a run whose checkpoints all fail their checks stops with its directory as it
/// was), the model (created from its preset when the directory has none), the codec, the
/// launcher and the event log.
pub(crate) fn prepare(
    plan: &RunPlan,
    registry: &Registry,
    opts: &RunOptions,
    held_out: Option<u32>,
) -> Result<Prepared, RlError> {
    rundir::prepare(plan, opts)?;
    let env = Env::build(
        registry,
        plan.environment.spec(plan.run.seed, held_out.unwrap_or(0)),
        Some(&opts.run_dir),
    )?;
    let resume_from = match opts.resume {
        true => resume_point(&opts.run_dir)?,
        false => None,
    };
    let model = warmstart::ModelPlan {
        target: &plan.model.path,
        preset: plan.model.init_preset.as_deref(),
        warm_start_steps: plan.model.warm_start_steps,
        seed: plan.run.seed,
    };
    warmstart::ensure_model(registry, &model, &env)?;
    let lacking = tandem_model::companion::missing(&plan.model.path);
    if !lacking.is_empty() {
        tracing::warn!(
            "model {} has no {}: neither will its checkpoints, so transformers or vLLM may \
             not load them as they are",
            plan.model.path.display(),
            lacking.join(", ")
        );
    }
    let codec = PromptCodec::for_env(&plan.model.path, &plan.environment.section)?;
    if let Some((dir, _)) = &resume_from {
        // A checkpoint written before checkpoints carried them gets the job model's
        // companion files (tokenizer, generation config) now.
        tandem_model::companion::complete(&plan.model.path, dir)?;
    }
    let launcher = LocalLauncher::new(super::launch::launch_options(plan, opts)?)?;
    let files = RunFiles::of(&opts.run_dir);
    let events = EventLog::open(&files.events)?;
    Ok(Prepared {
        env,
        codec,
        resume_from,
        launcher,
        files,
        events,
    })
}

/// The trackers of `plan`, started on the run directory (`None` without `[logging]`
/// trackers). A resumed run's trackers send again from the step of its checkpoint, the one
/// before `first_step`.
fn start_tracking(
    plan: &RunPlan,
    opts: &RunOptions,
    first_step: u32,
) -> Result<Option<tandem_track::Tracker>, RlError> {
    let run = tandem_track::RunInfo {
        run_dir: opts.run_dir.clone(),
        name: plan.name.clone(),
        config: serde_json::to_value(plan).unwrap_or_default(),
        job_text: plan.job.text.clone(),
        restart_at: opts.resume.then(|| first_step.saturating_sub(1)),
    };
    tandem_track::Tracker::start(&plan.tracking, run).map_err(|e| {
        RlError::usage(format!("[logging]: {e}")).with_help(format!(
            "the tracking state {} is damaged: move it away to start the trackers' runs anew",
            opts.run_dir.join(tandem_track::STATE_FILE).display()
        ))
    })
}

/// The checkpoint `--resume` continues from ([`checkpoint::newest_valid`]), one warning per
/// newer checkpoint skipped; half-written checkpoints are removed once one is chosen.
fn resume_point(run_dir: &Path) -> Result<Option<(PathBuf, LoopState)>, RlError> {
    let found = checkpoint::newest_valid(run_dir)?;
    checkpoint::clean_partial(run_dir);
    let Some(r) = found else {
        return Ok(None);
    };
    for s in &r.skipped {
        tracing::warn!(
            "skipping checkpoint {}: {}; resuming from {}",
            s.dir.display(),
            s.reason,
            r.dir.display()
        );
    }
    Ok(Some((r.dir, r.state)))
}
