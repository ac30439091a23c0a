//! The launcher: workers as subprocesses of this same binary, on this machine, or on other
//! nodes through Slurm's `srun` ([`slurm`]) or a Ray placement group ([`ray`]).
//!
//! [`LocalLauncher::new`] opens the control plane ([`ControlServer`], loopback by default;
//! workers on other hosts dial the advertised address).
//! Spawning a worker writes its [`WorkerSpec`] to `<run_dir>/workers/<role>-<rank>.json`,
//! starts `tandem worker ...` with stdout and stderr appended to
//! `<run_dir>/logs/<role>-<rank>.log` and the run token in [`TOKEN_ENV`], waits for its hello
//! and its `Ready`, and returns a [`RemoteEngine`] / [`RemoteTrainer`]. A constructor error in
//! the worker comes back as one [`RuntimeError::Plugin`]; a worker that dies before it is ready
//! is reported with its exit status and log tail. A monitor thread ([`monitor`]) notices a
//! worker dying later within [`monitor::POLL`] and fails its pending calls.
//!
//! Dropping the launcher kills (SIGKILL) every worker still running; [`LocalLauncher::shutdown`]
//! asks them to exit first.

mod command;
pub mod monitor;
pub mod ray;
mod remote;
mod route;
pub mod slurm;

pub use monitor::WorkerExit;
pub use ray::RayOptions;
pub use remote::{CallTimeouts, RemoteEngine, RemoteTrainer};
pub use route::{resolve, route_toward};
pub use slurm::SlurmOptions;

use crate::error::RuntimeError;
use crate::worker::WorkerSpec;
use monitor::WorkerProc;
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tandem_control::frame::{self, FrameError};
use tandem_control::protocol::{Role, ToController};
use tandem_control::{Channel, ControlServer, PeerLife};

/// Environment variable carrying the run token to the workers.
pub const TOKEN_ENV: &str = "TANDEM_CONTROL_TOKEN";

/// Settings of a [`LocalLauncher`].
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Run directory (`logs/` and `workers/` are created inside).
    pub run_dir: PathBuf,
    /// Control-plane listen address; loopback on a free port by default.
    pub bind: SocketAddr,
    /// Binary to run as `<exe> worker ...`; `None`: this process's own executable.
    pub exe: Option<PathBuf>,
    /// How long a worker may take from spawn to `Ready` (plugin loading and construction).
    pub startup_timeout: Duration,
    /// Timeouts of the remote handles' calls.
    pub timeouts: CallTimeouts,
    /// Workers' log verbosity (`-v` count: 0 warn, 1 info, 2 debug, 3 trace).
    pub worker_verbosity: u8,
    /// The address workers dial (`bind`'s, with an unspecified IP replaced by loopback, when
    /// `None`). Workers on other hosts need one they can route to.
    pub advertise: Option<std::net::IpAddr>,
    /// Start the workers through Slurm's `srun` instead of as children of this process.
    pub slurm: Option<SlurmOptions>,
    /// Place the workers with Ray instead (this process runs on a Ray node).
    pub ray: Option<RayOptions>,
}

impl LaunchOptions {
    /// Defaults: loopback, own executable, 300 s startup, default call timeouts, info logs.
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        LaunchOptions {
            run_dir: run_dir.into(),
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            exe: None,
            startup_timeout: Duration::from_secs(300),
            timeouts: CallTimeouts::default(),
            worker_verbosity: 1,
            advertise: None,
            slurm: None,
            ray: None,
        }
    }
}

/// A worker that is ready: its connection and its process.
type Started = (Arc<Channel>, Arc<WorkerProc>);

/// Launches and watches worker processes on this machine.
pub struct LocalLauncher {
    opts: LaunchOptions,
    exe: PathBuf,
    server: ControlServer,
    /// Every worker ever spawned.
    all: Vec<Arc<WorkerProc>>,
    /// Workers the monitor still watches.
    watched: Arc<Mutex<Vec<Arc<WorkerProc>>>>,
    /// The spec each (role, rank) was last started with.
    specs: HashMap<(Role, u32), WorkerSpec>,
    /// Starts so far (each worker's hello names its own).
    launches: u64,
    stop: Arc<AtomicBool>,
    monitor: Option<JoinHandle<()>>,
    /// The run's Ray placement group (with [`LaunchOptions::ray`]); released after the workers.
    ray: Option<ray::RayGroup>,
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { context, source }
}

impl LocalLauncher {
    /// Opens the control plane and starts the monitor.
    pub fn new(opts: LaunchOptions) -> Result<LocalLauncher, RuntimeError> {
        let exe = match &opts.exe {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(io("finding the tandem executable".into()))?,
        };
        for sub in ["logs", "workers"] {
            let dir = opts.run_dir.join(sub);
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let server = ControlServer::bind(opts.bind)?;
        let ray = match &opts.ray {
            Some(r) => Some(ray::RayGroup::place(r, &opts.run_dir)?),
            None => None,
        };
        let watched = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let monitor = monitor::spawn_monitor(watched.clone(), stop.clone())
            .map_err(io("starting the worker monitor".into()))?;
        Ok(LocalLauncher {
            opts,
            exe,
            server,
            all: Vec::new(),
            watched,
            specs: HashMap::new(),
            launches: 0,
            stop,
            monitor: Some(monitor),
            ray,
        })
    }

    /// The control plane's address, as workers dial it.
    pub fn control_addr(&self) -> SocketAddr {
        match self.opts.advertise {
            Some(ip) => SocketAddr::new(ip, self.server.local_addr().port()),
            None => self.server.connect_addr(),
        }
    }

    /// The run token (for tests and for launching a worker by hand).
    pub fn token(&self) -> &str {
        self.server.token()
    }

    /// Peers refused by the control plane so far.
    pub fn rejected_peers(&self) -> u64 {
        self.server.rejected_peers()
    }

    /// Starts engine workers (all processes first, then waits for each to be ready).
    pub fn spawn_engines(
        &mut self,
        specs: &[WorkerSpec],
    ) -> Result<Vec<RemoteEngine>, RuntimeError> {
        let t = self.opts.timeouts;
        self.spawn_all(Role::Engine, specs).map(|v| {
            v.into_iter()
                .map(|(c, p)| RemoteEngine::new(c, p, t))
                .collect()
        })
    }

    /// Starts trainer workers (all processes first, then waits for each to be ready).
    pub fn spawn_trainers(
        &mut self,
        specs: &[WorkerSpec],
    ) -> Result<Vec<RemoteTrainer>, RuntimeError> {
        let t = self.opts.timeouts;
        self.spawn_all(Role::Trainer, specs).map(|v| {
            v.into_iter()
                .map(|(c, p)| RemoteTrainer::new(c, p, t))
                .collect()
        })
    }

    fn spawn_all(
        &mut self,
        role: Role,
        specs: &[WorkerSpec],
    ) -> Result<Vec<Started>, RuntimeError> {
        if let Some(s) = specs.iter().find(|s| s.role != role) {
            return Err(RuntimeError::usage(format!(
                "spec for {} rank {} passed to spawn {role}s",
                s.role, s.rank
            )));
        }
        // All or nothing: when one worker of the batch fails, the others are stopped.
        let abandon = |procs: &[Arc<WorkerProc>]| {
            for p in procs {
                stop(p, "another worker of its batch failed to start");
            }
        };
        let mut procs = Vec::with_capacity(specs.len());
        for s in specs {
            match self.spawn(s) {
                Ok(p) => procs.push(p),
                Err(e) => {
                    abandon(&procs);
                    return Err(e);
                }
            }
        }
        let mut ready = Vec::with_capacity(procs.len());
        for p in &procs {
            match self.await_ready(p) {
                Ok(c) => ready.push((c, p.clone())),
                Err(e) => {
                    abandon(&procs);
                    return Err(e);
                }
            }
        }
        for s in specs {
            self.specs.insert((s.role, s.rank), s.clone());
        }
        Ok(ready)
    }

    fn spawn(&mut self, spec: &WorkerSpec) -> Result<Arc<WorkerProc>, RuntimeError> {
        let stem = format!("{}-{}", spec.role, spec.rank);
        let spec_path = self
            .opts
            .run_dir
            .join("workers")
            .join(format!("{stem}.json"));
        spec.write(&spec_path)?;
        let log_path = self.opts.run_dir.join("logs").join(format!("{stem}.log"));
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(format!("opening {}", log_path.display())))?;
        let _ = writeln!(
            log,
            "--- tandem {} rank {}: new worker ---",
            spec.role, spec.rank
        );
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let log_err = log
            .try_clone()
            .map_err(io(format!("opening {}", log_path.display())))?;
        self.launches += 1;
        let launch = self.launches;
        let (mut cmd, place, what) = command::worker(command::Worker {
            opts: &self.opts,
            ray: self.ray.as_ref(),
            exe: &self.exe,
            spec,
            spec_path: &spec_path,
            control: self.control_addr(),
            launch,
            token: self.server.token(),
        });
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        let child = cmd.spawn().map_err(io(format!(
            "starting {} rank {} ({what})",
            spec.role, spec.rank
        )))?;
        let proc = Arc::new(WorkerProc::new(
            spec.role,
            spec.rank,
            child,
            (launch, place),
            log_path,
            log_start,
        ));
        tracing::info!("started {}", proc.name);
        self.all.push(proc.clone());
        self.watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(proc.clone());
        Ok(proc)
    }

    /// Waits for the worker's hello and its `Ready`; on any failure the worker is killed.
    fn await_ready(&self, proc: &Arc<WorkerProc>) -> Result<Arc<Channel>, RuntimeError> {
        let result = self.try_await_ready(proc);
        if result.is_err() {
            proc.kill();
        }
        result
    }

    fn try_await_ready(&self, proc: &Arc<WorkerProc>) -> Result<Arc<Channel>, RuntimeError> {
        let name = &proc.name;
        let deadline = Instant::now() + self.opts.startup_timeout;
        let failed = |why: String| RuntimeError::runtime(format!("{name} failed to start: {why}"));
        let not_ready = || {
            let secs = self.opts.startup_timeout.as_secs();
            failed(format!("not ready within {secs} s"))
                .with_help("raise the startup timeout or read the worker's log")
        };
        let accepted = loop {
            match self.server.claim(proc.role, proc.rank, monitor::POLL) {
                Some(a) if a.launch == proc.launch => break a,
                // A late connection of an earlier process of this rank (e.g. one that timed
                // out and was killed): drop it and keep waiting for ours.
                Some(a) => tracing::warn!(
                    "{name}: dropped a connection from pid {} on {} (start {} of the rank, not {})",
                    a.pid,
                    a.host,
                    a.launch,
                    proc.launch
                ),
                None => {}
            }
            if let Some(exit) = proc.poll() {
                return Err(failed(exit.report));
            }
            if Instant::now() >= deadline {
                return Err(not_ready());
            }
        };
        let host = match accepted.peer {
            Some(p) => format!("{} ({})", accepted.host, p.ip()),
            None => accepted.host.clone(),
        };
        tracing::info!("{name} runs on {host} as pid {}", accepted.pid);
        *proc.host.lock().unwrap_or_else(|p| p.into_inner()) = Some(host);
        let mut stream = accepted.stream;
        let left = deadline.saturating_duration_since(Instant::now());
        let set = |s: &std::net::TcpStream, t| {
            s.set_read_timeout(t)
                .map_err(|e| failed(format!("control connection: {e}")))
        };
        set(&stream, Some(left.max(Duration::from_millis(1))))?;
        match frame::read::<ToController>(&mut stream, 1 << 20) {
            Ok(ToController::Ready { component }) => {
                set(&stream, None)?;
                let life: Arc<dyn PeerLife> = proc.clone();
                let channel = Arc::new(Channel::new(stream, name.clone(), Some(life))?);
                *proc.channel.lock().unwrap_or_else(|p| p.into_inner()) = Some(channel.clone());
                tracing::info!("{name} is ready ({component})");
                Ok(channel)
            }
            Ok(ToController::StartFailed { context, error }) => {
                proc.expected.store(true, Ordering::SeqCst);
                let context = if context.is_empty() {
                    format!("{name} failed to start")
                } else {
                    format!("{name} failed to start: {context}")
                };
                Err(RuntimeError::plugin(context, error))
            }
            Ok(other) => Err(failed(format!("expected `Ready`, got {other:?}"))),
            Err(e) if e.is_timeout() => Err(not_ready()),
            Err(e) => match proc.explain_exit(Duration::from_secs(2)) {
                Some(report) => Err(failed(report)),
                None => Err(failed(match e {
                    FrameError::Closed => "it closed the control connection".into(),
                    e => format!("control connection: {e}"),
                })),
            },
        }
    }

    /// Starts a new process for engine rank `rank` on another model directory, keeping the
    /// rest of the spec the rank was last started with (the checkpoint bridge restarts an
    /// engine on a new checkpoint this way). The running engine of that rank is left alone:
    /// the caller health-checks the new one, then stops the old one with
    /// [`RemoteEngine::exit`] — or stops the new one and keeps serving from the old.
    pub fn respawn_engine(
        &mut self,
        rank: u32,
        model_path: &Path,
    ) -> Result<RemoteEngine, RuntimeError> {
        let mut spec = self
            .specs
            .get(&(Role::Engine, rank))
            .cloned()
            .ok_or_else(|| {
                RuntimeError::usage(format!(
                    "respawn_engine: engine rank {rank} was never started by this launcher"
                ))
            })?;
        spec.model_path = model_path.to_path_buf();
        let mut engines = self.spawn_engines(std::slice::from_ref(&spec))?;
        engines.pop().ok_or_else(|| {
            RuntimeError::runtime(format!("respawn_engine: engine rank {rank} did not start"))
        })
    }

    /// The spec `role` rank `rank` was last started with.
    pub fn spec(&self, role: Role, rank: u32) -> Option<&WorkerSpec> {
        self.specs.get(&(role, rank))
    }

    /// Process ids of every worker still running (for memory accounting).
    pub fn live_pids(&self) -> Vec<u32> {
        self.all
            .iter()
            .filter(|p| p.poll().is_none())
            .map(|p| p.pid)
            .collect()
    }

    /// Asks every live worker to exit, waits up to `grace` for them, and kills the rest.
    /// Errors if a worker asked to exit did not exit with status 0.
    pub fn shutdown(mut self, grace: Duration) -> Result<(), RuntimeError> {
        let mut problems = Vec::new();
        for p in &self.all {
            let channel = p.channel.lock().unwrap_or_else(|e| e.into_inner()).take();
            let Some(channel) = channel.filter(|c| c.dead_reason().is_none()) else {
                continue;
            };
            p.expected.store(true, Ordering::SeqCst);
            if let Err(e) = remote::exit_worker(channel, p.clone(), self.opts.timeouts) {
                problems.push(e.to_string());
                continue;
            }
            match p.wait_exit(grace) {
                Some(exit) if exit.status.success() => {}
                Some(exit) => problems.push(format!("{}: {}", p.name, exit.report)),
                None => problems.push(format!(
                    "{}: still running {} s after `exit`; killed",
                    p.name,
                    grace.as_secs()
                )),
            }
        }
        self.teardown();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::runtime(problems.join("\n")))
        }
    }

    fn teardown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for p in &self.all {
            stop(p, "the launcher was shut down");
        }
        if let Some(m) = self.monitor.take() {
            let _ = m.join();
        }
        self.ray = None;
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.opts.run_dir
    }
}

/// Kills a worker on purpose: its handles then fail with `reason`, not with a death report.
fn stop(p: &WorkerProc, reason: &str) {
    if let Some(c) = p.channel.lock().unwrap_or_else(|e| e.into_inner()).take() {
        c.expect_close(reason.to_string());
    }
    p.kill();
}

impl Drop for LocalLauncher {
    fn drop(&mut self) {
        self.teardown();
    }
}
