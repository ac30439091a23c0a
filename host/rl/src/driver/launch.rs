//! Launching a run: the run directory and the model, then the workers — every engine rank
//! started and health-checked, the trainer spawned — each from the same component config
//! validation gave the plugin's `validate_config`.

use super::eval::Evaluation;
use super::rundir::{self, RunFiles, absolute};
use super::world::World;
use super::{Loop, RunOptions};
use crate::bridge::BridgeDriver;
use crate::checkpoint::{self, LoopState};
use crate::config::{LauncherKind, LoadedJob, PlacementMode, ResolvedPlan};
use crate::error::RlError;
use crate::eval::EvalSet;
use crate::events::EventLog;
use crate::phases::Engines;
use crate::prompt::PromptCodec;
use crate::task::HeldOut;
use crate::warmstart;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tandem_control::protocol::Role;
use tandem_runtime::launch::{
    LaunchOptions, LocalLauncher, RayOptions, RemoteEngine, RemoteTrainer, SlurmOptions,
};
use tandem_runtime::orchestrator::EngineMachine;
use tandem_runtime::registry::Registry;
use tandem_runtime::worker::WorkerSpec;

/// What launching a run reads: the job, its plan and the run's options.
#[derive(Clone, Copy)]
pub(super) struct Launch<'a> {
    pub job: &'a LoadedJob,
    pub plan: &'a ResolvedPlan,
    pub opts: &'a RunOptions,
}

impl<'a> Loop<'a> {
    /// Prepares the run directory and the model, starts the workers and initialises them
    /// (`init.rs`): on return the engines serve the trainer's weights and generate.
    pub(super) fn launch(
        job: &'a LoadedJob,
        plan: &'a ResolvedPlan,
        registry: &Registry,
        opts: &'a RunOptions,
    ) -> Result<Loop<'a>, RlError> {
        let j = &job.job;
        let task = crate::task::build_for_run(&j.task, j.run.seed, &j.eval)
            .map_err(|e| e.into_error(&job.path.display().to_string()))?;
        let mut bridge = BridgeDriver::new(
            registry,
            &plan.bridge.mode,
            plan.bridge.verify,
            &j.bridge.options,
        )?;
        bridge.set_source_model(&plan.model_path);
        rundir::prepare(job, opts)?;
        // Before anything is written: a run whose checkpoints all fail their checks stops here
        // with its directory as it was.
        let resume_from = if opts.resume {
            resume_point(&opts.run_dir)?
        } else {
            None
        };
        let model = warmstart::ModelPlan {
            target: &plan.model_path,
            preset: plan.model_init_preset.as_deref(),
            warm_start_steps: j.model.warm_start_steps,
            seed: j.run.seed,
        };
        warmstart::ensure_model(registry, &model, task.as_ref())?;
        let lacking = tandem_model::companion::missing(&plan.model_path);
        if !lacking.is_empty() {
            tracing::warn!(
                "model {} has no {}: neither will its checkpoints, so transformers or vLLM may \
                 not load them as they are",
                plan.model_path.display(),
                lacking.join(", ")
            );
        }
        let codec = PromptCodec::for_task(&plan.model_path, &j.task)?;
        let eval = evaluation(job, &codec)?;
        if let Some((dir, _)) = &resume_from {
            // A checkpoint written before checkpoints carried them gets the job model's
            // companion files (tokenizer, generation config) now.
            tandem_model::companion::complete(&plan.model_path, dir)?;
        }
        let mut launcher = LocalLauncher::new(launch_options(j, opts)?)?;
        let files = RunFiles::of(&opts.run_dir);
        let events = EventLog::open(&files.events)?;
        let launch = Launch { job, plan, opts };
        let world = bridge_world(&launcher, plan, &j.transport, &bridge)?;
        let (engines, trainer) = launch.spawn(&mut launcher, &bridge, world.as_ref(), &events)?;
        let drafter = launch.spawn_drafter(&mut launcher)?;
        let parts = super::init::Parts {
            task,
            codec,
            eval,
            launcher,
            bridge,
            events,
            files,
            world,
            drafter,
        };
        Loop::init(launch, parts, engines, trainer, resume_from)
    }
}

/// The launcher's options for a run of `j`: its run directory and executable, and the
/// `[launcher]` (validated): Slurm's nodes, and the advertised address (`auto`: the one that
/// routes to the first node named), which the control plane also listens on.
pub(super) fn launch_options(
    j: &crate::config::JobFile,
    opts: &RunOptions,
) -> Result<LaunchOptions, RlError> {
    let mut options = LaunchOptions::new(absolute(&opts.run_dir));
    options.exe = opts.exe.clone();
    let l = &j.launcher;
    let advertise = match l.advertise.as_deref() {
        Some("auto") => {
            let nodes: Vec<String> = l
                .engine_nodes
                .iter()
                .chain(&l.trainer_nodes)
                .cloned()
                .collect();
            let (ip, toward) = match l.kind {
                LauncherKind::Ray => ray_route(l, &nodes)?,
                _ => (
                    tandem_runtime::launch::slurm::advertise_toward(&nodes).map_err(|e| {
                        RlError::failed(format!("launcher.advertise = \"auto\": {e}"))
                    })?,
                    nodes[0].clone(),
                ),
            };
            tracing::info!("advertising {ip} to the workers (the route toward {toward})");
            Some(ip)
        }
        Some(a) => a.parse().ok(),
        None => None,
    };
    if let Some(ip) = advertise {
        options.advertise = Some(ip);
        options.bind = std::net::SocketAddr::new(ip, 0);
    }
    if l.kind == LauncherKind::Slurm {
        options.slurm = Some(SlurmOptions {
            engine_nodes: l.engine_nodes.clone(),
            trainer_nodes: l.trainer_nodes.clone(),
            partition: l.partition.clone(),
            srun_args: l.srun_args.clone(),
        });
    }
    if l.kind == LauncherKind::Ray {
        options.ray = Some(ray_options(j));
    }
    Ok(options)
}

/// Ray's options: one bundle per rank of the job's resources, plus `node:<ip>` where the
/// job names the rank's node; the drafter trainer shares the last trainer's bundle.
fn ray_options(j: &crate::config::JobFile) -> RayOptions {
    let l = &j.launcher;
    let base = l.ray_resources();
    let bundles = |nodes: &[String], ranks: u32| -> Vec<BTreeMap<String, f64>> {
        (0..ranks as usize)
            .map(|r| {
                let mut b = base.clone();
                if let Some(ip) = nodes.get(r).or(nodes.last()) {
                    b.insert(format!("node:{ip}"), 0.001);
                }
                b
            })
            .collect()
    };
    RayOptions {
        python: ray_python(l.python.as_deref()),
        address: l.address.clone().unwrap_or_else(|| "auto".into()),
        strategy: l.strategy.as_str().into(),
        engine_bundles: bundles(&l.engine_nodes, j.engine.ranks),
        trainer_bundles: bundles(&l.trainer_nodes, j.trainer.ranks),
    }
}

/// The Ray driver's python: the job's, `$TANDEM_RAY_PYTHON`, the one `scripts/setup-ray.sh`
/// recorded in `${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/ray-python`, else `python3`.
fn ray_python(job: Option<&Path>) -> PathBuf {
    if let Some(p) = job {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("TANDEM_RAY_PYTHON").filter(|p| !p.is_empty()) {
        return p.into();
    }
    let root = std::env::var_os("TANDEM_VENV_ROOT")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tandem")));
    root.and_then(|r| std::fs::read_to_string(r.join("ray-python")).ok())
        .map(|s| PathBuf::from(s.trim()))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// `advertise = "auto"` with Ray: the route toward the first node named, else toward the
/// cluster's head (`launcher.address` as `host:port`).
fn ray_route(
    l: &crate::config::LauncherSection,
    nodes: &[String],
) -> Result<(std::net::IpAddr, String), RlError> {
    let fail = |why: String| RlError::failed(format!("launcher.advertise = \"auto\": {why}"));
    let toward = match (nodes.first(), l.address.as_deref()) {
        (Some(n), _) => n.clone(),
        (None, Some(a)) if a != "auto" => a.rsplit_once(':').map_or(a, |(h, _)| h).to_string(),
        _ => {
            return Err(fail(
                "name the nodes or launcher.address (the head's host:port)".into(),
            ));
        }
    };
    let ip = tandem_runtime::launch::resolve(&toward)
        .ok_or_else(|| fail(format!("`{toward}` does not resolve")))?;
    let local =
        tandem_runtime::launch::route_toward(ip).map_err(|e| fail(format!("{toward}: {e}")))?;
    Ok((local, toward))
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

/// The transport world of a run whose bridge moves data over it ([`World::for_bridge`]).
pub(super) fn bridge_world(
    launcher: &LocalLauncher,
    plan: &ResolvedPlan,
    transport: &crate::config::TransportSection,
    bridge: &BridgeDriver,
) -> Result<Option<World>, RlError> {
    if !bridge.needs_transport() {
        return Ok(None);
    }
    World::for_bridge(
        launcher,
        plan.engine.ranks,
        &transport.backend,
        transport.timeout_secs,
    )
    .map(Some)
}

/// The run's evaluation (`[eval] every > 0`): the held-out set encoded as the rollouts'
/// prompts are.
fn evaluation(job: &LoadedJob, codec: &PromptCodec) -> Result<Option<Evaluation>, RlError> {
    let j = &job.job;
    if !j.eval.enabled() {
        return Ok(None);
    }
    let held_out = HeldOut::new(&j.task, j.run.seed, j.eval.problems)
        .map_err(|e| e.into_error(&job.path.display().to_string()))?;
    let max_tokens = j.eval.max_tokens.unwrap_or(j.algorithm.max_tokens);
    Ok(Some(Evaluation {
        set: EvalSet::new(&held_out, codec, max_tokens)?,
        every: j.eval.every,
    }))
}

impl Launch<'_> {
    /// Spawns the engine ranks and the trainer and starts every engine.
    pub(super) fn spawn(
        &self,
        launcher: &mut LocalLauncher,
        bridge: &BridgeDriver,
        world: Option<&World>,
        events: &EventLog,
    ) -> Result<(Engines, RemoteTrainer), RlError> {
        let engine_specs = (0..self.plan.engine.ranks)
            .map(|r| {
                let mut s = self.spec(Role::Engine, r)?;
                s.transport = world.map(|w| w.spec(1 + r));
                Ok(s)
            })
            .collect::<Result<Vec<_>, RlError>>()?;
        let mut trainer_spec = self.spec(Role::Trainer, 0)?;
        trainer_spec.transport = world.map(|w| w.spec(0));
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
        let engines = Engines {
            remotes,
            machines,
            needs_offload: self.colocated() && self.job.job.engine.needs_offload,
            // Engine `activations` are decode scratch (small) and may be reallocated by an
            // adapter swap during the sync, which a tag-wide resume would then refuse: the
            // drained offload releases weights and KV cache, the memory that matters.
            // Only what the engine declares releasable: capabilities are declared, never
            // discovered by failure.
            release_tags: bridge
                .engine_release_tags()
                .into_iter()
                .filter(|t| t != "activations" && self.plan.engine.releasable_tags.contains(t))
                .collect(),
        };
        Ok((engines, trainer))
    }

    /// The drafter trainer of a job with `[drafter] enabled`: trainer rank `N` after the
    /// policy's `N` ranks, a world of its own.
    pub(super) fn spawn_drafter(
        &self,
        launcher: &mut LocalLauncher,
    ) -> Result<Option<RemoteTrainer>, RlError> {
        let (job, plan) = (&self.job.job, self.plan);
        let Some(c) = &plan.drafter_trainer else {
            return Ok(None);
        };
        let options_json = crate::config::options_json(&job.drafter.options)
            .map_err(|e| RlError::usage(format!("[drafter.options]: {e}")))?;
        let spec = WorkerSpec {
            role: Role::Trainer,
            rank: plan.trainer.ranks,
            world_size: 1,
            component: c.component.clone(),
            model_path: absolute(&plan.model_path),
            options_json,
            device: crate::config::device_of(&plan.devices, 0),
            run_dir: absolute(&self.opts.run_dir),
            plugin_dirs: self.opts.plugin_dirs.iter().map(|d| absolute(d)).collect(),
            transport: None,
        };
        let remote = launcher
            .spawn_trainers(&[spec])?
            .pop()
            .ok_or_else(|| RlError::failed("the drafter trainer worker did not start"))?;
        Ok(Some(remote))
    }

    /// Draft tokens per round the engines propose (`[engine.options] draft_tokens`, else the
    /// native engine's default of 4).
    pub(super) fn draft_tokens(&self) -> u32 {
        self.job
            .job
            .engine
            .options
            .get("draft_tokens")
            .and_then(toml::Value::as_integer)
            .map_or(4, |k| k.clamp(1, 64) as u32)
    }

    /// Engine and trainer share devices (and take turns with their memory).
    pub fn colocated(&self) -> bool {
        self.plan.placement == PlacementMode::Colocate
    }

    /// The trainer's tags the staged onload offloads (colocated only): what the bridge lets
    /// go of and the trainer declares releasable.
    pub fn trainer_offload(&self, bridge: &BridgeDriver) -> Vec<String> {
        if !self.colocated() {
            return Vec::new();
        }
        bridge
            .trainer_offload_tags()
            .into_iter()
            .filter(|t| self.plan.trainer.releasable_tags.contains(t))
            .collect()
    }

    /// The worker spec of `role`'s rank `rank`: the same JSON and device validation gave the
    /// plugin's `validate_config`.
    pub(super) fn spec(&self, role: Role, rank: u32) -> Result<WorkerSpec, RlError> {
        let (job, plan) = (&self.job.job, self.plan);
        let (component, world, table) = match role {
            Role::Engine => (
                &plan.engine.component,
                plan.engine.ranks,
                &job.engine.options,
            ),
            Role::Trainer => (
                &plan.trainer.component,
                plan.trainer.ranks,
                &job.trainer.options,
            ),
        };
        let mut table = table.clone();
        if role == Role::Engine
            && job.drafter.enabled
            && let Some(rows) = job.drafter.speculate_below_batch
        {
            table.insert("speculate_below_batch".into(), i64::from(rows).into());
        }
        let options_json = crate::config::options_json(&table)
            .map_err(|e| RlError::usage(format!("[{role}.options]: {e}")))?;
        Ok(WorkerSpec {
            role,
            rank,
            world_size: world,
            component: component.clone(),
            model_path: absolute(&plan.model_path),
            options_json,
            device: crate::config::device_of(&plan.devices, rank),
            run_dir: absolute(&self.opts.run_dir),
            plugin_dirs: self.opts.plugin_dirs.iter().map(|d| absolute(d)).collect(),
            transport: None,
        })
    }
}
