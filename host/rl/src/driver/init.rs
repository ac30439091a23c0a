//! Initialisation, in the order of a step: the engines (started by `launch.rs`) give their
//! memory back at once (colocated), the trainer loads, snapshots `ref` (with a KL penalty)
//! and, on `--resume`, loads the newest complete checkpoint; it snapshots `actor`; the bridge
//! is set up; the metrics log opens; the staged onload (with a sync when the engines serve
//! another version than the trainer's) brings the engines back.

use super::eval::Evaluation;
use super::launch::Launch;
use super::trainer::Trainer;
use super::{Cursor, Loop, Phases, RunFiles};
use crate::bridge::BridgeDriver;
use crate::checkpoint::{self, LoopState};
use crate::env::Env;
use crate::error::RlError;
use crate::events::EventLog;
use crate::metrics::MetricsLog;
use crate::phases::Engines;
use crate::progress::Progress;
use crate::prompt::PromptCodec;
use std::path::{Path, PathBuf};
use tandem_runtime::launch::{LocalLauncher, RemoteTrainer};

/// What a run holds before its workers are initialised.
pub(super) struct Parts {
    pub env: Env,
    pub codec: PromptCodec,
    pub eval: Option<Evaluation>,
    pub launcher: LocalLauncher,
    pub bridge: BridgeDriver,
    pub events: EventLog,
    pub files: RunFiles,
    pub world: Option<super::world::World>,
    /// The drafter trainer (`[drafter] enabled`), spawned, not initialised.
    pub drafter: Option<RemoteTrainer>,
    /// PPO's critic (`[critic]`), spawned, not initialised.
    pub critic: Option<RemoteTrainer>,
}

/// The newest complete checkpoint to resume from, and the loop state saved with it.
type ResumeFrom = Option<(PathBuf, LoopState)>;

impl<'a> Loop<'a> {
    /// Initialises the started workers (see the module doc) into a loop ready for its first
    /// step.
    pub(super) fn init(
        launch: Launch<'a>,
        mut parts: Parts,
        mut engines: Engines,
        trainer: RemoteTrainer,
        resume_from: ResumeFrom,
    ) -> Result<Loop<'a>, RlError> {
        let (plan, opts) = (launch.plan, launch.opts);
        let events = &parts.events;
        // Colocated: the engines give their memory back before the trainer loads.
        engines.drained_offload(events, 0)?;
        let mut cursor = init_trainer(
            &trainer,
            events,
            0,
            plan.algorithm.kl_coef > 0.0,
            &resume_from,
        )?;
        cursor.total_steps = opts.steps.unwrap_or(plan.run.steps);
        trainer.snapshot("actor")?;
        events.record(0, "trainer", "snapshot", "actor");
        parts
            .bridge
            .setup(&trainer, &mut engines.remotes, &mut parts.launcher)?;
        events.record(0, "loop", "bridge_setup", &plan.bridge.component);
        let draft = match (parts.drafter, &plan.drafter.rl) {
            (Some(remote), Some(settings)) => {
                Some(super::draft::Draft::start(remote, settings, events)?)
            }
            _ => None,
        };
        let critic = match parts.critic {
            Some(c) => Some(init_critic(c, events, &resume_from)?),
            None => None,
        };
        let algorithm = crate::algorithm::for_plan(plan, critic);
        let metrics = open_metrics(&parts.files.metrics, opts.resume, &cursor, &resume_from)?;
        let offload = launch.trainer_offload(&parts.bridge);
        let chaos = super::chaos::Chaos::new(opts.chaos.as_deref(), cursor.total_steps)
            .map_err(|e| RlError::usage(e).with_help("unset it, or see `tandem run --help`"))?;
        let mut l = Loop {
            plan,
            opts,
            model: &plan.model.path,
            env: std::sync::Arc::new(parts.env),
            codec: std::sync::Arc::new(parts.codec),
            launcher: parts.launcher,
            bridge: parts.bridge,
            events: parts.events,
            engines,
            trainer: Trainer::new(trainer, offload),
            metrics,
            // Shown from the first step on (a silent one until then).
            progress: Progress::new(cursor.first_step, cursor.total_steps, false),
            files: parts.files,
            cursor,
            last_checkpoint: resume_from.map(|(dir, _)| dir),
            eval: parts.eval,
            _world: parts.world,
            launch,
            algorithm,
            replay: Vec::new(),
            force_sync: false,
            restarts: super::recover::Restarts::new(&plan.run),
            chaos,
            draft,
            ahead: super::ahead::Ahead::default(),
        };
        l.first_onload()?;
        if let Some(d) = &l.draft {
            d.size_engines(&l.engines.remotes)?;
        }
        l.progress = Progress::new(l.cursor.first_step, l.cursor.total_steps, opts.progress);
        Ok(l)
    }

    /// The staged onload that ends the init, with a sync when the engines serve an older
    /// version than the trainer's (with `ipc` the setup already made them serve its weights).
    fn first_onload(&mut self) -> Result<(), RlError> {
        let served = self.served();
        let trainer_version = self.cursor.weight_version;
        let mut phases = Phases::new();
        let record = self.staged_onload(0, trainer_version > served, &mut phases)?;
        if let Some(rec) = record {
            self.cursor.weight_version = rec.version;
        }
        Ok(())
    }
}

/// The trainer's init, its `ref` snapshot (with a KL penalty) and, on `--resume` or a
/// restart, the checkpoint, recorded as events of `step`: where the steps start
/// (`total_steps` is the caller's).
pub(super) fn init_trainer(
    trainer: &RemoteTrainer,
    events: &EventLog,
    step: u32,
    kl: bool,
    resume_from: &ResumeFrom,
) -> Result<Cursor, RlError> {
    let info = trainer.init()?;
    let version = info.weight_version;
    events.record(step, "trainer", "init", &format!("version {version}"));
    if kl {
        trainer.snapshot("ref")?;
        events.record(step, "trainer", "snapshot", "ref");
    }
    let Some((dir, state)) = resume_from else {
        return Ok(cursor(1, 0, version));
    };
    let ck = trainer.load_checkpoint(&dir.display().to_string())?;
    if ck.weight_version != state.weight_version {
        return Err(RlError::failed(format!(
            "{}: the trainer loaded weight version {} but the loop state says {}",
            dir.display(),
            ck.weight_version,
            state.weight_version
        )));
    }
    events.record(
        step,
        "trainer",
        "load_checkpoint",
        &format!("{} version {}", dir.display(), ck.weight_version),
    );
    Ok(cursor(
        state.step + 1,
        state.data_position,
        ck.weight_version,
    ))
}

/// PPO's critic initialised (a value model made from the policy's model) and, on
/// `--resume`, loaded from the checkpoint's `critic/`.
fn init_critic(
    critic: RemoteTrainer,
    events: &EventLog,
    resume_from: &ResumeFrom,
) -> Result<RemoteTrainer, RlError> {
    let info = critic.init()?;
    let name = crate::algorithm::ppo::CRITIC;
    events.record(
        0,
        name,
        "init",
        &format!("{} parameters", info.trainable_params),
    );
    if let Some((dir, _)) = resume_from {
        let dir = dir.join(crate::algorithm::ppo::CHECKPOINT_DIR);
        critic.load_checkpoint(&dir.display().to_string())?;
        events.record(0, name, "load_checkpoint", &dir.display().to_string());
    }
    Ok(critic)
}

fn cursor(first_step: u32, data_position: u64, weight_version: u64) -> Cursor {
    Cursor {
        first_step,
        total_steps: 0,
        data_position,
        weight_version,
    }
}

/// A new metrics log, or on `--resume` the old one without the steps that run again (the
/// checkpoint's own step line restored from the checkpoint when the run died before it).
fn open_metrics(
    path: &Path,
    resume: bool,
    cursor: &Cursor,
    resume_from: &ResumeFrom,
) -> Result<MetricsLog, RlError> {
    if !resume {
        return MetricsLog::create(path);
    }
    let saved = resume_from
        .as_ref()
        .and_then(|(dir, _)| checkpoint::step_metrics(dir));
    MetricsLog::resume(path, cursor.first_step - 1, saved)
}
