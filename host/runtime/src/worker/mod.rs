//! `tandem worker` (hidden subcommand): one engine or trainer rank in its own process.
//!
//! Started by the launcher as `tandem worker --role engine|trainer --rank N --control ADDR
//! --token-env VAR --spec FILE`. It connects to the controller first (so every later failure
//! can be reported over the connection), reads its [`WorkerSpec`], loads the plugin registry
//! from the spec's plugin directories, constructs its component with a [`Services`] handle
//! (with a CPU memory manager: plugin buffers are tagged host regions),
//! sends `Ready` (or `StartFailed` with the constructor's error, then exits 2), and serves
//! calls until the controller sends `Exit` (exit 0) or goes away (exit 1). A plugin error is
//! an error reply; it never ends the worker.
//!
//! The token travels in the environment variable named by `--token-env`, never in argv,
//! where every local user could read it in `ps`. A worker whose parent process dies exits
//! within [`PARENT_POLL`], even in the middle of a plugin call.

mod bridge;
mod pin;
mod serve;

pub use pin::allowed_cpus;

use crate::error::RuntimeError;
use crate::registry::Registry;
use crate::services::Services;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tandem_control::protocol::{Role, ToController};
use tandem_control::{self as control, frame};
use tandem_memory::{ManagerConfig, MemoryManager};
use tandem_plugin_api::{ComponentConfig, EngineBox, ErrorCode, PluginError, TrainerBox};

/// How long a worker tries to reach the controller.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a worker checks that its parent still lives.
const PARENT_POLL: Duration = Duration::from_millis(250);

/// Arguments of `tandem worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Which role this worker plays.
    #[arg(long, value_enum)]
    pub role: Role,
    /// Rank within the role.
    #[arg(long)]
    pub rank: u32,
    /// The controller's control-plane address.
    #[arg(long, value_name = "ADDR")]
    pub control: SocketAddr,
    /// Name of the environment variable holding the run's token.
    #[arg(long, value_name = "VAR")]
    pub token_env: String,
    /// The worker spec (JSON) the launcher wrote.
    #[arg(long, value_name = "FILE")]
    pub spec: PathBuf,
    /// Which start of this rank this process is (the launcher claims only its own).
    #[arg(long, default_value_t = 0)]
    pub launch: u64,
}

/// Everything a worker needs to construct its component; written by the launcher as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    /// Role of the worker.
    pub role: Role,
    /// Rank within the role.
    pub rank: u32,
    /// Number of ranks of the role.
    pub world_size: u32,
    /// Component name (the job file's `plugin = ...`).
    pub component: String,
    /// Model directory (may be empty).
    pub model_path: PathBuf,
    /// The component's options table as JSON.
    pub options_json: String,
    /// Device, e.g. `cpu`.
    pub device: String,
    /// Run directory.
    pub run_dir: PathBuf,
    /// Plugin directories to load the registry from (built-ins are always there).
    pub plugin_dirs: Vec<PathBuf>,
    /// The transport world this worker joins (the data plane), if the run has one.
    #[serde(default)]
    pub transport: Option<TransportSpec>,
    /// CPU cores this worker and what it starts run on (`[placement.cpus]`; empty: all).
    #[serde(default)]
    pub cpus: Vec<u32>,
}

/// The transport world a worker joins, written by the controller that hosts its rendezvous
/// store. The run's token authenticates the store and the links; it travels in the
/// environment with the control plane's, never in the spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSpec {
    /// The rendezvous store, `host:port`.
    pub store: String,
    /// Key namespace of this world in the store (fresh per run incarnation).
    pub name: String,
    /// This worker's rank in the world.
    pub world_rank: u32,
    /// Ranks in the world.
    pub world_size: u32,
    /// Named groups of world ranks, in group-rank order; a worker builds those it is in.
    pub groups: Vec<(String, Vec<u32>)>,
    /// The job's `[transport] backend`: `auto`, `shm`, `tcp` or `nccl`.
    pub backend: String,
    /// Seconds before a silent peer is declared dead (also bounds the rendezvous).
    pub timeout_secs: f64,
}

impl TransportSpec {
    /// The communicator config of this rank (`token`: the run's).
    pub fn comm_config(
        &self,
        token: &str,
    ) -> Result<tandem_transport::CommConfig, tandem_transport::TransportError> {
        let mut c = tandem_transport::CommConfig::new(
            &self.store,
            token,
            self.world_rank as usize,
            self.world_size as usize,
        );
        c.name = self.name.clone();
        c.transport = self.backend.parse()?;
        c.timeout = Duration::from_secs_f64(self.timeout_secs.max(0.001));
        Ok(c)
    }

    /// The groups as the transport names them.
    pub fn group_specs(&self) -> Vec<tandem_transport::topology::GroupSpec> {
        self.groups
            .iter()
            .map(|(name, ranks)| tandem_transport::topology::GroupSpec {
                name: name.clone(),
                ranks: ranks.iter().map(|&r| r as usize).collect(),
            })
            .collect()
    }
}

impl WorkerSpec {
    /// The spec of a one-rank component on the CPU (benches, tests, one-off tools); plugins
    /// from `plugin_dirs` besides the built-ins.
    pub fn single_cpu(
        role: Role,
        component: &str,
        model_path: &Path,
        options_json: &str,
        run_dir: &Path,
        plugin_dirs: Vec<PathBuf>,
    ) -> WorkerSpec {
        WorkerSpec {
            role,
            rank: 0,
            world_size: 1,
            component: component.into(),
            model_path: model_path.to_path_buf(),
            options_json: options_json.into(),
            device: "cpu".into(),
            run_dir: run_dir.to_path_buf(),
            plugin_dirs,
            transport: None,
            cpus: Vec::new(),
        }
    }

    /// The constructor argument for the component.
    pub fn component_config(&self) -> ComponentConfig {
        ComponentConfig {
            component: self.component.as_str().into(),
            model_path: self.model_path.to_string_lossy().as_ref().into(),
            options_json: self.options_json.as_str().into(),
            rank: self.rank,
            world_size: self.world_size,
            device: self.device.as_str().into(),
            run_dir: self.run_dir.to_string_lossy().as_ref().into(),
        }
    }

    /// Writes the spec as pretty JSON.
    pub fn write(&self, path: &Path) -> Result<(), RuntimeError> {
        let io = |source| RuntimeError::Io {
            context: format!("writing worker spec {}", path.display()),
            source,
        };
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| RuntimeError::runtime(format!("cannot encode a worker spec: {e}")))?;
        std::fs::write(path, text).map_err(io)
    }

    /// Reads a spec written by [`WorkerSpec::write`].
    pub fn read(path: &Path) -> Result<WorkerSpec, RuntimeError> {
        let text = std::fs::read_to_string(path).map_err(|source| RuntimeError::Io {
            context: format!("reading worker spec {}", path.display()),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| {
            RuntimeError::usage(format!("{}: invalid worker spec: {e}", path.display()))
                .with_help("worker specs are written by `tandem run`")
        })
    }
}

/// The constructed component a worker serves, and the bridge it may hold beside it.
pub(crate) struct Component {
    pub role: RoleComponent,
    pub bridges: bridge::Bridges,
}

/// The worker's engine or trainer.
pub(crate) enum RoleComponent {
    Engine(EngineBox),
    Trainer(TrainerBox),
}

/// Runs a worker until the controller sends `Exit` (Ok) or goes away (Err).
pub fn run(args: WorkerArgs) -> Result<(), RuntimeError> {
    let token = std::env::var(&args.token_env).map_err(|_| {
        RuntimeError::usage(format!(
            "worker: environment variable `{}` (--token-env) is not set",
            args.token_env
        ))
        .with_help("workers are started by `tandem run`, which sets it")
    })?;
    let mut stream = control::connect(
        args.control,
        &token,
        args.role,
        args.rank,
        args.launch,
        CONNECT_TIMEOUT,
    )?;
    tracing::info!(
        "{} rank {} (pid {}) connected to {}",
        args.role,
        args.rank,
        std::process::id(),
        args.control
    );
    watch_parent();
    let services = worker_services(args.role, args.rank);
    let (component, name, services) = match construct(&args, services, &token) {
        Ok(c) => c,
        Err(err) => {
            let (context, error) = start_failure(&err);
            let msg = ToController::StartFailed { context, error };
            if let Err(e) = frame::write(&mut stream, &msg) {
                tracing::warn!("could not report the start failure to the controller: {e}");
            }
            return Err(err);
        }
    };
    let ready = ToController::Ready { component: name };
    frame::write(&mut stream, &ready).map_err(|e| {
        RuntimeError::runtime(format!("worker: sending ready to the controller: {e}"))
    })?;
    serve::serve(stream, component, &services)
}

/// The services a worker's component gets: a CPU memory manager named after the rank, so
/// every buffer the plugin allocates is a tagged host region (`weights`, `kv_cache`,
/// `optimizer`, `grads`, `activations`) that release/offload by tag really frees, and that
/// another worker can map by its key (the `ipc` bridge).
fn worker_services(role: Role, rank: u32) -> Services {
    let config = ManagerConfig::cpu(format!("{role}-{rank}"));
    Services::with_memory(MemoryManager::new(config))
}

/// Exits the process once its parent (the controller) is gone and it was re-parented, even
/// while a plugin call is running: a worker never outlives the run that started it. (The
/// control connection's EOF catches the same case, but only between calls' reads.)
fn watch_parent() {
    let parent = std::os::unix::process::parent_id();
    let spawned = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(PARENT_POLL);
                if std::os::unix::process::parent_id() != parent {
                    tracing::error!("the controller (pid {parent}) is gone; exiting");
                    std::process::exit(1);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch the controller process: {e}");
    }
}

/// Reads the spec, joins its transport world (on a thread: peers may start later) and
/// constructs the component with the services that result.
fn construct(
    args: &WorkerArgs,
    services: Services,
    token: &str,
) -> Result<(Component, String, Services), RuntimeError> {
    let spec = WorkerSpec::read(&args.spec)?;
    if spec.role != args.role || spec.rank != args.rank {
        return Err(RuntimeError::usage(format!(
            "{}: the spec is for {} rank {}, but this worker is {} rank {}",
            args.spec.display(),
            spec.role,
            spec.rank,
            args.role,
            args.rank
        ))
        .with_help("pass the spec the launcher wrote for this rank"));
    }
    pin::pin_process(&spec.cpus)?;
    if !spec.cpus.is_empty() {
        tracing::info!(
            "{} rank {} pinned to CPUs {:?}",
            spec.role,
            spec.rank,
            pin::allowed_cpus()
        );
    }
    let services = match &spec.transport {
        None => services,
        Some(t) => {
            let cfg = t.comm_config(token).map_err(|e| {
                RuntimeError::usage(format!("{}: transport: {e}", args.spec.display()))
            })?;
            let groups = t.group_specs();
            // The rendezvous waits for every rank; a call waits for the rendezvous.
            let wait = cfg.timeout * 2;
            services.joining_transport(wait, move || {
                let world = tandem_transport::Communicator::init(&cfg)?;
                log_links(&world);
                world.groups(&groups)
            })
        }
    };
    let registry = Registry::discover(&spec.plugin_dirs).map_err(RuntimeError::Plugins)?;
    let config = spec.component_config();
    let role = match spec.role {
        Role::Engine => RoleComponent::Engine(registry.new_engine(config, services.handle())?),
        Role::Trainer => RoleComponent::Trainer(registry.new_trainer(config, services.handle())?),
    };
    let name = spec.component.clone();
    let bridges = bridge::Bridges::new(registry, spec, services.clone());
    Ok((Component { role, bridges }, name, services))
}

/// One line per peer: the backend the plan chose from the placements every rank published at
/// rendezvous (`transport: world rank 1 on n2-1a2b3c4d -> rank 0 on n1-1a2b3c4d: tcp`).
fn log_links(world: &tandem_transport::Communicator) {
    let me = world.global_rank();
    let places = world.placements();
    let host = |r: usize| places.get(r).map_or("?", |p| p.host.as_str());
    for peer in (0..places.len()).filter(|&r| r != me) {
        tracing::info!(
            "transport: world rank {me} on {} -> rank {peer} on {}: {}",
            host(me),
            host(peer),
            world.plan().backend(me, peer)
        );
    }
}

/// A start failure as (context, plugin error) for the wire; user errors keep `InvalidInput`
/// so the controller's exit code stays 2, and the error's help travels as the plugin error's.
fn start_failure(err: &RuntimeError) -> (String, PluginError) {
    match err {
        RuntimeError::Plugin { context, source } => (context.clone(), source.clone()),
        other => {
            let code = if other.exit_code() == 2 {
                ErrorCode::InvalidInput
            } else {
                ErrorCode::Runtime
            };
            let message = other.to_string().lines().collect::<Vec<_>>().join("; ");
            let mut error = PluginError::new(code, message);
            if let Some(help) = other.help() {
                error = error.with_help(help);
            }
            (String::new(), error)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_start_failure_keeps_its_code_and_its_help() {
        let err = super::RuntimeError::usage("bad spec").with_help("pass the right one");
        let (context, error) = super::start_failure(&err);
        assert_eq!(context, "");
        assert_eq!(error.code, super::ErrorCode::InvalidInput);
        assert_eq!(error.message.as_str(), "bad spec");
        assert_eq!(error.help.as_str(), "pass the right one");
    }
}
