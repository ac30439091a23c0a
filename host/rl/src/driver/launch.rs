//! Launching a run: the run directory and the model, then the workers — every engine rank
//! started and health-checked, the trainer spawned — each from the same component config
//! validation gave the plugin's `validate_config`.

use super::eval::Evaluation;
use super::rundir::absolute;
use super::world::World;
use super::{Loop, RunOptions};
use crate::bridge::BridgeDriver;
use crate::config::{LauncherKind, RolePlan, RunPlan};
use crate::error::RlError;
use crate::eval::EvalSet;
use crate::events::EventLog;
use crate::phases::Engines;
use crate::prompt::PromptCodec;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tandem_control::protocol::Role;
use tandem_runtime::launch::{
    LaunchOptions, LocalLauncher, RayOptions, RemoteEngine, RemoteTrainer, SlurmOptions,
};
use tandem_runtime::orchestrator::EngineMachine;
use tandem_runtime::registry::Registry;
use tandem_runtime::worker::WorkerSpec;

/// What launching a run reads: its plan and the run's options.
#[derive(Clone, Copy)]
pub(crate) struct Launch<'a> {
    pub plan: &'a RunPlan,
    pub opts: &'a RunOptions,
}

impl<'a> Loop<'a> {
    /// Prepares the run directory and the model, starts the workers and initialises them
    /// (`init.rs`): on return the engines serve the trainer's weights and generate.
    pub(super) fn launch(
        plan: &'a RunPlan,
        registry: &Registry,
        opts: &'a RunOptions,
    ) -> Result<Loop<'a>, RlError> {
        let held_out = plan.eval.as_ref().map(|e| e.problems);
        let mut bridge = BridgeDriver::new(&plan.bridge);
        bridge.set_source_model(&plan.model.path);
        let p = super::skeleton::prepare(plan, registry, opts, held_out)?;
        let eval = evaluation(plan, &p.env, &p.codec)?;
        let mut launcher = p.launcher;
        let launch = Launch { plan, opts };
        let world = bridge_world(&launcher, plan, &bridge)?;
        let (engines, trainer) = launch.spawn(&mut launcher, &bridge, world.as_ref(), &p.events)?;
        let drafter = launch.spawn_drafter(&mut launcher)?;
        let critic = launch.spawn_critic(&mut launcher)?;
        let parts = super::init::Parts {
            env: p.env,
            codec: p.codec,
            eval,
            launcher,
            bridge,
            events: p.events,
            files: p.files,
            world,
            drafter,
            critic,
        };
        Loop::init(launch, parts, engines, trainer, p.resume_from)
    }
}

/// The launcher's options for a run of `j`: its run directory and executable, and the
/// `[launcher]` (validated): Slurm's nodes, and the advertised address (`auto`: the one that
/// routes to the first node named), which the control plane also listens on.
pub(super) fn launch_options(plan: &RunPlan, opts: &RunOptions) -> Result<LaunchOptions, RlError> {
    let mut options = LaunchOptions::new(absolute(&opts.run_dir));
    options.exe = opts.exe.clone();
    let l = &plan.launcher.settings;
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
        options.ray = Some(ray_options(plan));
    }
    Ok(options)
}

/// Ray's options: one bundle per rank of the job's resources, plus `node:<ip>` where the
/// job names the rank's node; the drafter trainer shares the last trainer's bundle.
fn ray_options(plan: &RunPlan) -> RayOptions {
    let l = &plan.launcher.settings;
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
        engine_bundles: bundles(&l.engine_nodes, plan.engine.world_size()),
        trainer_bundles: bundles(&l.trainer_nodes, plan.trainer.world_size()),
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

/// The transport world of a run whose bridge moves data over it ([`World::for_bridge`]).
pub(super) fn bridge_world(
    launcher: &LocalLauncher,
    plan: &RunPlan,
    bridge: &BridgeDriver,
) -> Result<Option<World>, RlError> {
    if !bridge.needs_transport() {
        return Ok(None);
    }
    let t = &plan.transport;
    World::for_bridge(
        launcher,
        plan.engine.world_size(),
        &t.backend,
        t.timeout_secs,
    )
    .map(Some)
}

/// The run's evaluation (`[eval] every > 0`): the held-out set encoded as the rollouts'
/// prompts are.
fn evaluation(
    plan: &RunPlan,
    env: &crate::env::Env,
    codec: &PromptCodec,
) -> Result<Option<Evaluation>, RlError> {
    let Some(e) = &plan.eval else {
        return Ok(None);
    };
    Ok(Some(Evaluation {
        set: EvalSet::new(env.held_out(e.problems)?, codec, e.max_tokens)?,
        every: e.every,
    }))
}

/// Starts every spawned engine and checks it is ready (one `start` event each); the state
/// machine of each, at the weight version it serves.
pub(crate) fn start_engines(
    remotes: &[RemoteEngine],
    events: &EventLog,
) -> Result<Vec<EngineMachine>, RlError> {
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
    Ok(machines)
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
        let engine_specs = (0..self.plan.engine.world_size())
            .map(|r| {
                let mut s = self.spec(Role::Engine, r);
                s.transport = world.map(|w| w.spec(1 + r));
                s
            })
            .collect::<Vec<_>>();
        let mut trainer_spec = self.spec(Role::Trainer, 0);
        trainer_spec.transport = world.map(|w| w.spec(0));
        let remotes: Vec<RemoteEngine> = launcher.spawn_engines(&engine_specs)?;
        let trainer = launcher
            .spawn_trainers(&[trainer_spec])?
            .pop()
            .ok_or_else(|| RlError::failed("the trainer worker did not start"))?;
        let machines = start_engines(&remotes, events)?;
        let engines = Engines {
            remotes,
            machines,
            needs_offload: self.plan.engine.needs_offload,
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
        let Some(d) = &self.plan.drafter.rl else {
            return Ok(None);
        };
        let mut spec = self.spec_of(Role::Trainer, &d.trainer, 0);
        spec.rank = self.plan.trainer.world_size();
        let remote = launcher
            .spawn_trainers(&[spec])?
            .pop()
            .ok_or_else(|| RlError::failed("the drafter trainer worker did not start"))?;
        Ok(Some(remote))
    }

    /// PPO's critic (`[critic]`): trainer rank `N` after the policy's `N` ranks and the
    /// drafter's, a worker of its own.
    pub(super) fn spawn_critic(
        &self,
        launcher: &mut LocalLauncher,
    ) -> Result<Option<RemoteTrainer>, RlError> {
        let Some(c) = &self.plan.critic else {
            return Ok(None);
        };
        let mut spec = self.spec_of(Role::Trainer, c, 0);
        spec.rank = self.plan.trainer.world_size() + u32::from(self.plan.drafter.rl.is_some());
        let remote = launcher
            .spawn_trainers(&[spec])?
            .pop()
            .ok_or_else(|| RlError::failed("the critic worker did not start"))?;
        Ok(Some(remote))
    }

    /// Engine and trainer share devices (and take turns with their memory).
    pub fn colocated(&self) -> bool {
        self.plan.colocated()
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

    /// The worker spec of `role`'s rank `rank`: the component config validation gave the
    /// plugin's `validate_config`.
    pub(crate) fn spec(&self, role: Role, rank: u32) -> WorkerSpec {
        let plan = match role {
            Role::Engine => &self.plan.engine,
            Role::Trainer => &self.plan.trainer,
        };
        self.spec_of(role, plan, rank)
    }

    /// The worker spec of rank `rank` of the role `plan`.
    fn spec_of(&self, role: Role, plan: &RolePlan, rank: u32) -> WorkerSpec {
        WorkerSpec {
            role,
            rank,
            world_size: plan.world_size(),
            component: plan.component.clone(),
            model_path: plan.model_path.clone(),
            options_json: plan.options_json.clone(),
            device: plan.device(rank),
            run_dir: absolute(&self.opts.run_dir),
            plugin_dirs: self.opts.plugin_dirs.iter().map(|d| absolute(d)).collect(),
            transport: None,
            cpus: match role {
                Role::Engine => self.plan.placement.cpus.engine.clone(),
                Role::Trainer => self.plan.placement.cpus.trainer.clone(),
            },
        }
    }
}
