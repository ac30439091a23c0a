//! The loop: launch workers, initialise in the seeds' order, run the steps, shut down.
//!
//! Init: engines start (and, colocated, are drained and released at once); the trainer
//! loads, snapshots `ref` (with a KL penalty) and, on `--resume`, loads the newest complete
//! checkpoint; the bridge is set up; the engines get the trainer's weights when they differ.
//!
//! Step: generate → drained offload (pause all → flush all → release all) → train (onload
//! trainer → `ref` logprobs → GRPO steps → snapshot `actor`) → save every N → offload the
//! trainer (all but its weights) → onload engine weights → sync → offload the trainer's
//! weights → onload the KV cache → continue. The trainer's weights stay resident through the
//! sync because the trainer side of a sync reads them (a checkpoint or adapter is written
//! from them; with `ipc` they are the engines' weights and are never offloaded).

use super::checkpoint::{self, LoopState};
use super::events::EventLog;
use super::grpo;
use super::metrics::{MetricsLog, StepMetrics, rss_bytes};
use super::phases::Engines;
use super::plot;
use super::progress::Progress;
use super::prompt::PromptCodec;
use super::rollout::{self, RolloutSpec};
use super::warmstart;
use crate::bridge::BridgeDriver;
use crate::config::{LoadedJob, PlacementMode, ResolvedPlan};
use tandem_control::protocol::Role;
use crate::error::RlError;
use tandem_runtime::launch::{LaunchOptions, LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_runtime::orchestrator::EngineMachine;
use tandem_runtime::registry::Registry;
use crate::task::Task;
use tandem_runtime::worker::WorkerSpec;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tandem_plugin_api::WhichWeights;
use tandem_plugin_api::tags::WEIGHTS;

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
    /// The run directory.
    pub run_dir: PathBuf,
    /// Newest checkpoint.
    pub checkpoint: Option<PathBuf>,
}

/// Files of a run directory.
pub struct RunFiles {
    /// `metrics.jsonl`.
    pub metrics: PathBuf,
    /// `events.jsonl`.
    pub events: PathBuf,
    /// `plot.png`.
    pub plot: PathBuf,
    /// `run.json` (job path, for `--resume`).
    pub run_json: PathBuf,
}

impl RunFiles {
    /// The files of `run_dir`.
    pub fn of(run_dir: &Path) -> RunFiles {
        RunFiles {
            metrics: run_dir.join("metrics.jsonl"),
            events: run_dir.join("events.jsonl"),
            plot: run_dir.join("plot.png"),
            run_json: run_dir.join("run.json"),
        }
    }
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> RlError {
    move |source| RlError::Io { context, source }
}

/// Adds the wall time of `f` to `phases[name]`.
fn timed<T>(
    phases: &mut BTreeMap<String, f64>,
    name: &str,
    f: impl FnOnce() -> Result<T, RlError>,
) -> Result<T, RlError> {
    let t = Instant::now();
    let r = f();
    *phases.entry(name.to_string()).or_default() += t.elapsed().as_secs_f64();
    r
}

fn metric(m: &[tandem_plugin_api::Metric], name: &str) -> f64 {
    m.iter()
        .find(|x| x.name.as_str() == name)
        .map(|x| x.value)
        .unwrap_or(f64::NAN)
}

fn spec(
    job: &LoadedJob,
    plan: &ResolvedPlan,
    role: Role,
    rank: u32,
    opts: &RunOptions,
) -> Result<WorkerSpec, RlError> {
    let (component, world, table) = match role {
        Role::Engine => (
            &plan.engine.component,
            plan.engine.ranks,
            &job.job.engine.options,
        ),
        Role::Trainer => (
            &plan.trainer.component,
            plan.trainer.ranks,
            &job.job.trainer.options,
        ),
    };
    // The same JSON and device `config::validate` gave the plugin's `validate_config`.
    let options_json = crate::config::options_json(table)
        .map_err(|e| RlError::usage(format!("[{role}.options]: {e}")))?;
    let device = crate::config::device_of(&plan.devices, rank);
    Ok(WorkerSpec {
        role,
        rank,
        world_size: world,
        component: component.clone(),
        model_path: absolute(&plan.model_path),
        options_json,
        device,
        run_dir: absolute(&opts.run_dir),
        plugin_dirs: opts.plugin_dirs.iter().map(|d| absolute(d)).collect(),
    })
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Checks the run directory: a new run needs one without metrics, a resume one with them.
fn prepare_run_dir(job: &LoadedJob, opts: &RunOptions) -> Result<(), RlError> {
    let files = RunFiles::of(&opts.run_dir);
    if opts.resume {
        if !files.metrics.is_file() {
            return Err(RlError::usage(format!(
                "--resume {}: not a run directory (no metrics.jsonl)",
                opts.run_dir.display()
            )));
        }
        return Ok(());
    }
    if files.metrics.exists() {
        return Err(RlError::usage(format!(
            "run directory {} already holds a run (help: continue it with `tandem run --resume {}`, or pass --output-dir NEW_DIR)",
            opts.run_dir.display(),
            opts.run_dir.display()
        )));
    }
    std::fs::create_dir_all(&opts.run_dir)
        .map_err(io(format!("creating {}", opts.run_dir.display())))?;
    let meta = serde_json::json!({
        "job": absolute(&job.path),
        "name": job.job.run.name,
    });
    std::fs::write(&files.run_json, meta.to_string())
        .map_err(io(format!("writing {}", files.run_json.display())))?;
    std::fs::write(opts.run_dir.join("job.toml"), &job.source).map_err(io(format!(
        "writing {}",
        opts.run_dir.join("job.toml").display()
    )))
}

/// The job file a run directory was started from (`run.json`).
pub fn job_of_run(run_dir: &Path) -> Result<PathBuf, RlError> {
    let path = RunFiles::of(run_dir).run_json;
    let text = std::fs::read_to_string(&path).map_err(|_| {
        RlError::usage(format!(
            "--resume {}: not a run directory (no run.json); give the run directory `tandem run` wrote",
            run_dir.display()
        ))
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| RlError::usage(format!("{}: {e}", path.display())))?;
    v.get("job")
        .and_then(|j| j.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| RlError::usage(format!("{}: no `job` entry", path.display())))
}

/// Runs a job validated by [`crate::config::validate_with`] (which made every check that
/// needs nothing started: trainer ranks, task, bridge settings, model directory, plugin
/// options), so nothing below refuses the job after the run directory exists.
pub fn run(
    job: &LoadedJob,
    plan: &ResolvedPlan,
    registry: &Registry,
    opts: RunOptions,
) -> Result<RunSummary, RlError> {
    let j = &job.job;
    let task = crate::task::build(&j.task, j.run.seed)
        .map_err(|e| RlError::usage(format!("{}: {e}", job.path.display())))?;
    let mut bridge = BridgeDriver::new(&plan.bridge.mode, plan.bridge.verify, &j.bridge.options)?;
    prepare_run_dir(job, &opts)?;
    warmstart::ensure_model(
        registry,
        &plan.model_path,
        plan.model_init_preset.as_deref(),
        j.model.warm_start_steps,
        task.as_ref(),
        j.run.seed,
    )?;
    let codec = PromptCodec::load(&plan.model_path)?;
    let resume_from = if opts.resume {
        checkpoint::clean_partial(&opts.run_dir);
        checkpoint::newest(&opts.run_dir)?
    } else {
        None
    };
    let mut launch = LaunchOptions::new(absolute(&opts.run_dir));
    launch.exe = opts.exe.clone();
    let mut launcher = LocalLauncher::new(launch)?;
    let files = RunFiles::of(&opts.run_dir);
    let events = EventLog::open(&files.events)?;
    let mut loop_ = Loop::start(
        job,
        plan,
        &opts,
        &mut launcher,
        &mut bridge,
        &events,
        resume_from,
    )?;
    let result = loop_.run_steps(
        task.as_ref(),
        &codec,
        &mut launcher,
        &mut bridge,
        &events,
        &files,
    );
    events.flush();
    let summary = result?;
    launcher.shutdown(Duration::from_secs(20))?;
    Ok(summary)
}

/// Live state of a run.
struct Loop<'a> {
    job: &'a LoadedJob,
    opts: &'a RunOptions,
    engines: Engines,
    trainer: RemoteTrainer,
    colocate: bool,
    /// Trainer tags offloaded right now.
    trainer_offloaded: Vec<String>,
    /// Tags the trainer declares releasable (the only ones it is asked to offload).
    trainer_releasable: Vec<String>,
    first_step: u32,
    total_steps: u32,
    data_position: u64,
    weight_version: u64,
    metrics: Option<MetricsLog>,
}

impl<'a> Loop<'a> {
    fn start(
        job: &'a LoadedJob,
        plan: &'a ResolvedPlan,
        opts: &'a RunOptions,
        launcher: &mut LocalLauncher,
        bridge: &mut BridgeDriver,
        events: &EventLog,
        resume_from: Option<(PathBuf, LoopState)>,
    ) -> Result<Loop<'a>, RlError> {
        let j = &job.job;
        let colocate = plan.placement == PlacementMode::Colocate;
        let engine_specs = (0..plan.engine.ranks)
            .map(|r| spec(job, plan, Role::Engine, r, opts))
            .collect::<Result<Vec<_>, _>>()?;
        let trainer_spec = spec(job, plan, Role::Trainer, 0, opts)?;
        let remotes: Vec<RemoteEngine> = launcher.spawn_engines(&engine_specs)?;
        let trainer = launcher
            .spawn_trainers(&[trainer_spec])?
            .pop()
            .ok_or_else(|| RlError::failed("the trainer worker did not start"))?;
        let mut machines = Vec::with_capacity(remotes.len());
        for (rank, e) in remotes.iter().enumerate() {
            e.start()?;
            let h = e.health()?;
            if !h.ready {
                return Err(RlError::failed(format!(
                    "engine rank {rank} is not ready after start: {}",
                    h.detail
                )));
            }
            events.record(0, &format!("engine-{rank}"), "start", "");
            machines.push(EngineMachine::new(h.weight_version));
        }
        let mut engines = Engines {
            remotes,
            machines,
            needs_offload: colocate && j.engine.needs_offload,
            // Engine `activations` are decode scratch (small) and may be reallocated by an
            // adapter swap during the sync, which a tag-wide resume would then refuse: the
            // drained offload releases weights and KV cache, the memory that matters.
            // Only what the engine declares releasable: capabilities are declared, never
            // discovered by failure.
            release_tags: bridge
                .engine_release_tags()
                .into_iter()
                .filter(|t| t != "activations" && plan.engine.releasable_tags.contains(t))
                .collect(),
        };
        // Colocated: the engines give their memory back before the trainer loads.
        engines.drained_offload(events, 0)?;
        let info = trainer.init()?;
        events.record(
            0,
            "trainer",
            "init",
            &format!("version {}", info.weight_version),
        );
        if j.algorithm.kl_coef > 0.0 {
            trainer.snapshot("ref")?;
            events.record(0, "trainer", "snapshot", "ref");
        }
        let (first_step, data_position, mut weight_version) = match &resume_from {
            Some((dir, state)) => {
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
                    0,
                    "trainer",
                    "load_checkpoint",
                    &format!("{} version {}", dir.display(), ck.weight_version),
                );
                (state.step + 1, state.data_position, ck.weight_version)
            }
            None => (1, 0, info.weight_version),
        };
        trainer.snapshot("actor")?;
        events.record(0, "trainer", "snapshot", "actor");
        bridge.setup(&trainer, &mut engines.remotes, launcher)?;
        events.record(0, "loop", "bridge_setup", &plan.bridge.mode);
        let metrics_path = RunFiles::of(&opts.run_dir).metrics;
        let metrics = if opts.resume {
            let saved = resume_from
                .as_ref()
                .and_then(|(dir, _)| checkpoint::step_metrics(dir));
            MetricsLog::resume(&metrics_path, first_step - 1, saved)?
        } else {
            MetricsLog::create(&metrics_path)?
        };
        let total_steps = opts.steps.unwrap_or(j.run.steps);
        let mut l = Loop {
            job,
            opts,
            engines,
            trainer,
            colocate,
            trainer_offloaded: Vec::new(),
            trainer_releasable: plan.trainer.releasable_tags.clone(),
            first_step,
            total_steps,
            data_position,
            weight_version: 0,
            metrics: Some(metrics),
        };
        // With ipc the setup already made the engines serve the trainer's weights.
        let served = bridge.version().unwrap_or_else(|| {
            l.engines
                .machines
                .iter()
                .map(EngineMachine::version)
                .min()
                .unwrap_or(0)
        });
        let mut phases = BTreeMap::new();
        let need_sync = weight_version > served;
        l.finish_step(
            0,
            need_sync,
            &mut weight_version,
            bridge,
            launcher,
            events,
            &mut phases,
        )?;
        l.weight_version = weight_version;
        Ok(l)
    }

    /// The end of a step (and of init): trainer offload, staged onload around the sync.
    #[allow(clippy::too_many_arguments)]
    fn finish_step(
        &mut self,
        step: u32,
        sync: bool,
        version: &mut u64,
        bridge: &mut BridgeDriver,
        launcher: &mut LocalLauncher,
        events: &EventLog,
        phases: &mut BTreeMap<String, f64>,
    ) -> Result<Option<crate::bridge::SyncRecord>, RlError> {
        let offload: Vec<String> = if self.colocate {
            bridge
                .trainer_offload_tags()
                .into_iter()
                .filter(|t| self.trainer_releasable.contains(t))
                .collect()
        } else {
            Vec::new()
        };
        let (weights, rest): (Vec<String>, Vec<String>) =
            offload.into_iter().partition(|t| t == WEIGHTS);
        // The trainer half of the sync reads the weights: export before any trainer offload.
        let update = if sync {
            Some(timed(phases, "sync", || bridge.export(&self.trainer))?)
        } else {
            None
        };
        timed(phases, "offload_trainer", || {
            self.offload_trainer(step, rest, events)
        })?;
        // An engine about to be restarted on the new weights does not need its old ones back.
        let restarting = update.is_some() && bridge.restarts();
        if !restarting {
            timed(phases, "onload", || {
                self.engines.onload_weights(events, step)
            })?;
        }
        let record = match update {
            Some(update) => {
                if !restarting {
                    self.engines.begin_update(update.version)?;
                }
                let r = timed(phases, "sync", || {
                    bridge.apply(update, &mut self.engines.remotes, launcher)
                });
                match r {
                    Ok(rec) => {
                        self.engines.end_update(rec.restarted, rec.version)?;
                        events.record(
                            step,
                            "loop",
                            "sync",
                            &format!(
                                "version {} bytes {} restarted {} digest {}",
                                rec.version, rec.bytes_moved, rec.restarted, rec.digest
                            ),
                        );
                        *version = rec.version;
                        Some(rec)
                    }
                    Err(e) => {
                        self.engines.abort_update();
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        timed(phases, "offload_trainer", || {
            self.offload_trainer(step, weights, events)
        })?;
        timed(phases, "onload", || self.engines.onload_rest(events, step))?;
        timed(phases, "onload", || self.engines.continue_all(events, step))?;
        Ok(record)
    }

    fn offload_trainer(
        &mut self,
        step: u32,
        tags: Vec<String>,
        events: &EventLog,
    ) -> Result<(), RlError> {
        if tags.is_empty() {
            return Ok(());
        }
        self.trainer.offload(&tags)?;
        events.record(step, "trainer", "offload", &tags.join(","));
        self.trainer_offloaded.extend(tags);
        Ok(())
    }

    fn onload_trainer(&mut self, step: u32, events: &EventLog) -> Result<(), RlError> {
        if self.trainer_offloaded.is_empty() {
            return Ok(());
        }
        let tags = std::mem::take(&mut self.trainer_offloaded);
        self.trainer.onload(&tags)?;
        events.record(step, "trainer", "onload", &tags.join(","));
        Ok(())
    }

    fn run_steps(
        &mut self,
        task: &dyn Task,
        codec: &PromptCodec,
        launcher: &mut LocalLauncher,
        bridge: &mut BridgeDriver,
        events: &EventLog,
        files: &RunFiles,
    ) -> Result<RunSummary, RlError> {
        let j = &self.job.job;
        let a = &j.algorithm;
        let progress = Progress::new(self.first_step, self.total_steps, self.opts.progress);
        let mut last_checkpoint = None;
        for step in self.first_step..=self.total_steps {
            let t0 = Instant::now();
            let mut phases = BTreeMap::new();
            let spec = RolloutSpec {
                first_problem: self.data_position,
                prompts: a.prompts_per_step,
                group_size: a.group_size,
                max_tokens: a.max_tokens,
                temperature: a.temperature,
                seed: j.run.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ u64::from(step),
                adapter: bridge.request_adapter(),
            };
            let rollout = timed(&mut phases, "generate", || {
                rollout::run(&spec, &self.engines.remotes, task, codec)
            })?;
            self.data_position += u64::from(a.prompts_per_step);
            timed(&mut phases, "offload", || {
                self.engines.drained_offload(events, step)
            })?;
            // Resident memory where it is comparable step to step (what a leak would grow):
            // engines right after the drained offload, the trainer at the end of the step.
            // What the regions hold is in the ledger figures.
            let mut rss = BTreeMap::new();
            for (rank, e) in self.engines.remotes.iter().enumerate() {
                rss.insert(format!("engine-{rank}"), rss_bytes(e.pid()));
            }

            let adv = grpo::advantages(&rollout.samples);
            if std::env::var_os("TANDEM_DUMP_ROLLOUTS").is_some() {
                let path = self.opts.run_dir.join("rollouts.jsonl");
                let mut text = String::new();
                for (s, a) in rollout.samples.iter().zip(&adv) {
                    let line = serde_json::json!({"step": step, "group": s.group, "prompt": codec.decode(&s.prompt).unwrap_or_default(), "completion": codec.decode(&s.completion).unwrap_or_default(), "tokens": s.completion, "logprobs": s.logprobs, "reward": s.reward, "advantage": a});
                    text.push_str(&line.to_string());
                    text.push('\n');
                }
                use std::io::Write as _;
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                {
                    let _ = f.write_all(text.as_bytes());
                }
            }
            let loss = grpo::loss(a.learning_rate, a.clip_eps, a.kl_coef, a.grad_clip);
            let mut batch = grpo::batch(&rollout.samples, &adv, loss, a.kl_coef > 0.0);
            let mut m = StepMetrics {
                step,
                ..StepMetrics::default()
            };
            let n = rollout.samples.len().max(1) as f64;
            let rewards: Vec<f64> = rollout
                .samples
                .iter()
                .map(|s| f64::from(s.reward))
                .collect();
            m.reward_mean = rewards.iter().sum::<f64>() / n;
            m.reward_std = (rewards
                .iter()
                .map(|r| (r - m.reward_mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            m.exact_frac = rollout.exact as f64 / n;
            m.completion_tokens = rollout
                .samples
                .iter()
                .map(|s| s.completion.len())
                .sum::<usize>() as f64
                / n;
            m.train_sequences = batch.sequences.len() as u64;

            let before = self.weight_version;
            timed(&mut phases, "train", || {
                self.onload_trainer(step, events)?;
                if batch.sequences.is_empty() {
                    return Ok(());
                }
                if a.kl_coef > 0.0 {
                    let refs = self
                        .trainer
                        .compute_logprobs(batch.clone(), WhichWeights::Snapshot("ref".into()))?;
                    for (s, r) in batch.sequences.iter_mut().zip(refs) {
                        s.ref_logprobs = r.into();
                    }
                    events.record(step, "trainer", "ref_logprobs", "");
                }
                for _ in 0..a.train_steps_per_rollout.max(1) {
                    let out = self.trainer.train_step(batch.clone())?;
                    m.loss = metric(&out, "loss");
                    m.kl = metric(&out, "kl");
                    m.grad_norm = metric(&out, "grad_norm");
                    m.clip_frac = metric(&out, "clip_frac");
                    let v = metric(&out, "weight_version");
                    if v.is_finite() {
                        self.weight_version = v as u64;
                    }
                }
                events.record(
                    step,
                    "trainer",
                    "train",
                    &format!("version {}", self.weight_version),
                );
                self.trainer.snapshot("actor")?;
                events.record(step, "trainer", "snapshot", "actor");
                Ok(())
            })?;

            let save_every = j.run.save_every;
            if (save_every > 0 && step % save_every == 0) || step == self.total_steps {
                let state = LoopState {
                    step,
                    data_position: self.data_position,
                    weight_version: self.weight_version,
                };
                let mut partial = m.clone();
                partial.phases = phases.clone();
                partial.weight_version = self.weight_version;
                let dir = timed(&mut phases, "save", || {
                    checkpoint::save(&self.opts.run_dir, &self.trainer, &state, &partial)
                })?;
                events.record(step, "trainer", "checkpoint", &dir.display().to_string());
                last_checkpoint = Some(dir);
            }

            let mut version = self.weight_version;
            let sync = self.weight_version != before;
            let record = self.finish_step(
                step,
                sync,
                &mut version,
                bridge,
                launcher,
                events,
                &mut phases,
            )?;
            if let Some(r) = &record {
                m.sync_bytes = r.bytes_moved;
                m.sync_s = r.latency_s;
            }
            m.weight_version = self
                .engines
                .machines
                .iter()
                .map(EngineMachine::version)
                .min()
                .unwrap_or(0);
            rss.insert("trainer".to_string(), rss_bytes(self.trainer.pid()));
            m.rss = rss;
            self.ledger_figures(&mut m);
            m.step_s = t0.elapsed().as_secs_f64();
            m.overhead_s = (m.step_s - phases.values().sum::<f64>()).max(0.0);
            m.phases = phases;
            progress.step(&m);
            let metrics = self
                .metrics
                .as_mut()
                .ok_or_else(|| RlError::failed("metrics log closed"))?;
            metrics.push(m)?;
            if step % 10 == 0 || step == self.total_steps {
                events.flush();
                if let Err(e) = plot::draw(&files.plot, &j.run.name, &metrics.steps) {
                    progress.println(&format!("warning: {e}"));
                }
            }
        }
        progress.finish();
        let steps = self
            .metrics
            .as_ref()
            .map(|m| m.steps.clone())
            .unwrap_or_default();
        let first_reward = steps.first().map(|m| m.reward_mean).unwrap_or(f64::NAN);
        let tail: Vec<f64> = steps.iter().rev().take(5).map(|m| m.reward_mean).collect();
        let final_reward = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
        Ok(RunSummary {
            last_step: self.total_steps,
            first_reward,
            final_reward,
            run_dir: self.opts.run_dir.clone(),
            checkpoint: last_checkpoint,
        })
    }

    /// Memory-ledger bytes (allocated region bytes the plugins report) of every worker.
    fn ledger_figures(&self, m: &mut StepMetrics) {
        let mut add = |name: String, stats: Option<tandem_plugin_api::ComponentStats>| {
            if let Some(s) = stats {
                let ledger: f64 = s
                    .metrics
                    .iter()
                    .filter(|x| x.name.as_str().starts_with("allocated_bytes."))
                    .map(|x| x.value)
                    .sum();
                m.ledger.insert(name, ledger as u64);
            }
        };
        for (rank, e) in self.engines.remotes.iter().enumerate() {
            add(format!("engine-{rank}"), e.stats().ok());
        }
        add("trainer".into(), self.trainer.stats().ok());
    }
}
