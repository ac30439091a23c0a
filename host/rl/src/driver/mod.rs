//! The loop behind `tandem run`: launch and initialise, run the steps, shut down.
//!
//! Every job runs on one skeleton (`skeleton.rs`: the preparation — environment, run directory,
//! `--resume`'s checkpoint, model, launcher, events — and the run of the steps): the RL
//! loop here, and the drafter job (`crate::algorithm::drafter`). What an RL step trains is
//! the [`Algorithm`](crate::algorithm::Algorithm)'s (GRPO, or PPO with its critic).
//!
//! [`run`] builds a [`Loop`] (`launch.rs`: the workers; `init.rs`: the
//! trainer's init, `--resume`, the bridge's setup, the first staged onload), calls
//! [`Loop::step`] for every step and shuts the workers down. A step (`step.rs`) is a
//! sequence of phases, each a method of its own:
//!
//! 1. **rollout** — whole GRPO groups on every engine in parallel, decoded and rewarded;
//!    each rank's bubble state follows it ([`crate::bubble`]), and what speculative decoding
//!    did in it is read from the engines (`spec.rs`);
//! 2. **drained offload** — pause all → flush all → release all ([`crate::phases`]);
//! 3. **train** — the algorithm's advantages (PPO: the critic onloaded, its values, GAE)
//!    and its other models' steps (the critic's) → onload the trainer → `ref` logprobs
//!    (with a KL penalty) → the actor's steps → snapshot `actor`;
//! 4. **save** — a checkpoint every `save_every` steps and at the end;
//! 5. **sync** — the staged onload around the bridge's sync (`onload.rs`): offload the
//!    trainer (all but its weights) → the engines' weights back → the bridge ships the
//!    trainer's export → offload the trainer's weights → the KV cache back → continue. The
//!    trainer's weights stay resident through the sync because its half of the sync reads
//!    them (with `ipc` they are the engines' weights and are never offloaded);
//! 6. **eval** — with `[eval]`, on the steps it names (and before the first step): greedy
//!    accuracy on the held-out set through the serving engines (`eval.rs`);
//! 7. **record** — the step's metrics line, progress and plot (`record.rs`).
//!
//! A worker that dies during a step is restarted and the step goes on from where it was
//! (`recover/`); `TANDEM_CHAOS` kills workers on purpose to test that (`chaos.rs`).

mod ahead;
mod chaos;
mod draft;
mod dump;
mod eval;
mod init;
pub(crate) mod launch;
mod onload;
mod record;
mod recover;
pub(crate) mod rundir;
pub(crate) mod skeleton;
mod spec;
mod step;
mod trainer;
pub mod world;

pub use chaos::CHAOS_ENV;
pub use rundir::{RunFiles, job_of_run};

use crate::bridge::BridgeDriver;
use crate::config::RunPlan;
use crate::env::Env;
use crate::error::RlError;
use crate::events::EventLog;
use crate::metrics::MetricsLog;
use crate::phases::Engines;
use crate::progress::Progress;
use crate::prompt::PromptCodec;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_runtime::launch::LocalLauncher;
use tandem_runtime::registry::Registry;
use trainer::Trainer;

/// How to run a job.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Run directory (metrics, plot, events, checkpoints, logs).
    pub run_dir: PathBuf,
    /// Continue from the newest complete checkpoint in `run_dir`.
    pub resume: bool,
    /// Override of the job's step count.
    pub steps: Option<u32>,
    /// Show progress on stderr.
    pub progress: bool,
    /// Binary the workers run (`None`: this executable).
    pub exe: Option<PathBuf>,
    /// Plugin directories the workers load.
    pub plugin_dirs: Vec<PathBuf>,
    /// A schedule of kills dealt to the run's own workers, to test recovery (the syntax of
    /// [`CHAOS_ENV`]); `None` for a normal run.
    pub chaos: Option<String>,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Last step run.
    pub last_step: u32,
    /// Mean reward of the first recorded step.
    pub first_reward: f64,
    /// Mean reward over the last few steps.
    pub final_reward: f64,
    /// Step and held-out accuracy of the first evaluation (`[eval]`).
    pub first_eval: Option<(u32, f64)>,
    /// Step and held-out accuracy of the last evaluation (`[eval]`).
    pub last_eval: Option<(u32, f64)>,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Newest checkpoint.
    pub checkpoint: Option<PathBuf>,
}

/// Runs a job validated by [`crate::config::validate_with`] (which made every check that
/// needs nothing started: trainer ranks, task, bridge settings, model directory, plugin
/// options), so nothing below refuses the job after the run directory exists.
pub fn run(plan: &RunPlan, registry: &Registry, opts: RunOptions) -> Result<RunSummary, RlError> {
    skeleton::execute(Loop::launch(plan, registry, &opts)?, plan, &opts)
}

impl skeleton::Job for Loop<'_> {
    type Summary = RunSummary;

    fn steps(&self) -> (u32, u32) {
        (self.cursor.first_step, self.cursor.total_steps)
    }

    fn before(&mut self) -> Result<(), RlError> {
        self.eval_at_start()
    }

    fn step(&mut self, step: u32) -> Result<(), RlError> {
        Loop::step(self, step)
    }

    fn finish(&mut self) -> RunSummary {
        Loop::finish(self)
    }

    fn events(&self) -> &EventLog {
        &self.events
    }

    fn say(&self, line: &str) {
        self.progress.println(line);
    }

    fn checkpoint(&self) -> Option<PathBuf> {
        self.last_checkpoint.clone()
    }

    fn shutdown(self) -> Result<(), RlError> {
        Ok(self.launcher.shutdown(skeleton::SHUTDOWN_GRACE)?)
    }
}

/// Where a run is in its steps and its data.
struct Cursor {
    /// The first step this process runs (after `--resume`: the one after the checkpoint).
    first_step: u32,
    /// The last step.
    total_steps: u32,
    /// Index of the next problem of the environment's training split.
    data_position: u64,
    /// The trainer's weight version.
    weight_version: u64,
}

/// A run in progress: what its steps work on.
struct Loop<'a> {
    plan: &'a RunPlan,
    opts: &'a RunOptions,
    /// The job's model directory: the source of every written model dir's companion files.
    model: &'a Path,
    /// Shared with the rollout generated ahead (`ahead.rs`).
    env: Arc<Env>,
    codec: Arc<PromptCodec>,
    launcher: LocalLauncher,
    bridge: BridgeDriver,
    events: EventLog,
    engines: Engines,
    trainer: Trainer,
    metrics: MetricsLog,
    progress: Progress,
    files: RunFiles,
    cursor: Cursor,
    last_checkpoint: Option<PathBuf>,
    eval: Option<eval::Evaluation>,
    /// The workers' transport world, when the bridge moves data over it (kept alive).
    _world: Option<world::World>,
    /// What the run was launched from (a relaunch starts the workers the same way).
    launch: launch::Launch<'a>,
    /// What a step trains (`crate::algorithm`): GRPO, or PPO with its critic.
    algorithm: Box<dyn crate::algorithm::Algorithm>,
    /// What the actor trained on since the newest checkpoint, by step: what a restarted
    /// trainer replays.
    replay: Vec<(u32, crate::algorithm::Trained)>,
    /// The engines must be synced before they generate again (a restarted trainer they
    /// served from, or a replaced engine behind the trainer).
    force_sync: bool,
    /// The restart budget and the restarts so far.
    restarts: recover::Restarts,
    /// `TANDEM_CHAOS`: kills dealt on purpose (recovery tests, `tandem bench loop`).
    chaos: chaos::Chaos,
    /// The drafter trained in the rollouts' bubbles (`[drafter] enabled`).
    draft: Option<draft::Draft>,
    /// With `[algorithm] max_staleness` ≥ 1: the next step's rollout, generated while this
    /// step trains.
    ahead: ahead::Ahead,
}

/// Wall time of each phase of a step (s), by name.
type Phases = BTreeMap<String, f64>;

/// Adds the wall time of `f` to `phases[name]`.
fn timed<T>(
    phases: &mut Phases,
    name: &str,
    f: impl FnOnce() -> Result<T, RlError>,
) -> Result<T, RlError> {
    let t = Instant::now();
    let r = f();
    add_time(phases, name, t.elapsed());
    r
}

/// Adds `spent` to `phases[name]`.
fn add_time(phases: &mut Phases, name: &str, spent: Duration) {
    *phases.entry(name.to_string()).or_default() += spent.as_secs_f64();
}

#[cfg(test)]
mod tests {
    /// The run executes the plan validation built: no file of the loop (`driver/`) names the
    /// job file's types or TOML, so nothing below validation can read the job file again.
    /// (`run` taking `&RunPlan` and no job is checked by the compiler.)
    #[test]
    fn the_loop_reads_the_plan_and_never_the_job_file() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests.rs") {
                    out.push(p);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for sub in [
            "driver",
            "env",
            "phases.rs",
            "rollout.rs",
            "algorithm",
            "bubble",
        ] {
            let p = root.join(sub);
            if p.is_dir() {
                walk(&p, &mut files);
            } else {
                files.push(p);
            }
        }
        assert!(
            files.len() > 20,
            "found {} files under {}",
            files.len(),
            root.display()
        );
        let banned = ["LoadedJob", "JobFile", "toml::", "ResolvedPlan"];
        let mut found = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            for (i, line) in text.lines().enumerate() {
                // This test names them.
                if f.ends_with("driver/mod.rs") && line.contains("let banned") {
                    continue;
                }
                for b in banned {
                    if line.contains(b) {
                        found.push(format!("{}:{}: {b}", f.display(), i + 1));
                    }
                }
            }
        }
        assert!(found.is_empty(), "below validation:\n{}", found.join("\n"));
    }
}
