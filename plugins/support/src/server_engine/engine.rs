//! [`ServerEngine`]: the engine state, its constructor and the [`EngineImpl`] every server
//! plugin exports. Which lifecycle call is legal when is the shared [`EngineMachine`]'s
//! decision, checked *before* the server is called (a flush the machine forbids never
//! reaches the server); the machine moves only when the server accepted the call.
//!
//! Concurrency: the server slot is locked only to start, stop or read the client; HTTP calls
//! run outside every lock, so `pause_generation` from one thread reaches the server while
//! another waits in `generate`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tandem_plugin_api::files::state::saved_version;
use tandem_plugin_api::lifecycle::{EngineMachine, EngineState, TransitionError};
use tandem_plugin_api::sdk::{EngineImpl, Result};
use tandem_plugin_api::tags::{KV_CACHE, WEIGHTS};
use tandem_plugin_api::{
    ComponentConfig, ComponentStats, EngineHealth, GenerateRequest, GenerateResponse, HostBox,
    LogLevel, Metric, PauseMode, PluginError, RVec, UpdateReport, WeightUpdate,
};

use super::options::log_path;
use super::{Backend, Deadline, Server, Settings};

/// What the engine knows of what it serves.
#[derive(Debug)]
pub struct State {
    /// The lifecycle.
    pub machine: EngineMachine,
    /// The weight version served.
    pub version: u64,
    /// The directory the server serves (at start: the model directory).
    pub served_dir: PathBuf,
    /// The adapter generation uses when a request names none (the last adapter update's).
    pub active_adapter: Option<String>,
    /// Adapters loaded into the server.
    pub adapters: BTreeSet<String>,
    /// Timings for `stats`.
    pub metrics: Vec<(&'static str, f64)>,
}

impl State {
    /// Sets (or adds) a metric.
    pub fn set_metric(&mut self, name: &'static str, value: f64) {
        match self.metrics.iter_mut().find(|(n, _)| *n == name) {
            Some(m) => m.1 = value,
            None => self.metrics.push((name, value)),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One engine rank driving one server through a [`Backend`].
pub struct ServerEngine<B: Backend> {
    /// What this kind of server does (its options included).
    pub backend: B,
    pub(super) settings: Settings,
    pub(super) rank: u32,
    pub(super) log: PathBuf,
    host: HostBox,
    pub(super) server: Mutex<Option<Server>>,
    pub(super) state: Mutex<State>,
    /// Generate / score calls in flight (what `PauseMode::Wait` may wait for).
    pub(super) inflight: Mutex<usize>,
    pub(super) idle: Condvar,
}

impl<B: Backend> ServerEngine<B> {
    /// The engine of `config`'s rank; the served version is the one the trainer stored in
    /// the model directory, else 0. The server starts on `start` (or the first call that
    /// needs it).
    pub fn new(backend: B, settings: Settings, config: &ComponentConfig, host: HostBox) -> Self {
        let dir = PathBuf::from(config.model_path.as_str());
        let version = saved_version(&dir).unwrap_or(0);
        let log = log_path(B::DIALECT.component, config.run_dir.as_str(), config.rank);
        ServerEngine {
            rank: config.rank,
            log,
            host,
            state: Mutex::new(State {
                machine: EngineMachine::new(version),
                version,
                served_dir: dir,
                active_adapter: None,
                adapters: BTreeSet::new(),
                metrics: Vec::new(),
            }),
            server: Mutex::new(None),
            inflight: Mutex::new(0),
            idle: Condvar::new(),
            backend,
            settings,
        }
    }

    /// The deadline of a call.
    pub fn timeout(&self, deadline: Deadline) -> Duration {
        Duration::from_secs(match deadline {
            Deadline::Request => self.settings.request_timeout_s,
            Deadline::Control => self.settings.control_timeout_s,
        })
    }

    /// This engine's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The log file of a launched server (`<run_dir>/logs/<component>-<rank>.log`).
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// The engine state (locked; keep it short and make no call while holding it).
    pub fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// A line in the host's log under the component's name.
    pub fn log(&self, level: LogLevel, msg: &str) {
        self.host
            .log(level, B::DIALECT.component.into(), msg.into());
    }

    /// An illegal lifecycle call, as this engine's `InvalidState`.
    pub fn illegal(&self, e: TransitionError) -> PluginError {
        PluginError::invalid_state(format!("engine `{}`: {e}", B::DIALECT.component))
    }

    /// Moves a copy of the machine with `step` (refused: `InvalidState`), runs `call`, and
    /// keeps the moved machine only when `call` succeeded.
    fn transition(
        &self,
        step: impl FnOnce(&mut EngineMachine) -> std::result::Result<(), TransitionError>,
        call: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut next = lock(&self.state).machine.clone();
        step(&mut next).map_err(|e| self.illegal(e))?;
        call()?;
        lock(&self.state).machine = next;
        Ok(())
    }
}

impl<B: Backend> EngineImpl for ServerEngine<B> {
    fn component(&self) -> &str {
        B::DIALECT.component
    }

    fn start(&self) -> Result<()> {
        self.client().map(drop)
    }

    fn health(&self) -> Result<EngineHealth> {
        if lock(&self.server).is_none() {
            return Ok(EngineHealth {
                ready: false,
                weight_version: lock(&self.state).version,
                detail: format!("{} server not started", B::DIALECT.display).into(),
            });
        }
        self.backend.health(self)
    }

    fn shutdown(&self) -> Result<()> {
        if let Some(mut s) = lock(&self.server).take() {
            s.stop();
        }
        Ok(())
    }

    fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        self.generate_batch(request)
    }

    fn score(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        self.score_batch(sequences)
    }

    fn pause_generation(&self, mode: PauseMode) -> Result<()> {
        // Paused before the call, so no new request starts while the server drains; back to
        // the previous state if the server refuses.
        let before = {
            let mut st = lock(&self.state);
            let before = st.machine.clone();
            st.machine.pause().map_err(|e| self.illegal(e))?;
            before
        };
        let res = self.backend.pause(self, mode);
        if res.is_err() {
            lock(&self.state).machine = before;
        }
        res
    }

    fn continue_generation(&self) -> Result<()> {
        self.transition(
            |m| m.continue_generation().map(drop),
            || self.backend.continue_generation(self),
        )
    }

    fn flush_cache(&self) -> Result<()> {
        self.transition(|m| m.flush().map(drop), || self.backend.flush(self))
    }

    fn release_memory(&self, tags: Vec<String>) -> Result<()> {
        self.backend.check_memory("release_memory", &tags)?;
        self.transition(
            |m| m.release(&tags).map(drop),
            || self.backend.release(self, &tags),
        )
    }

    fn resume_memory(&self, tags: Vec<String>) -> Result<()> {
        self.backend.check_memory("resume_memory", &tags)?;
        self.transition(
            |m| m.resume(&tags).map(drop),
            || {
                // Weights first, then the KV cache (slime's order).
                for t in [WEIGHTS, KV_CACHE] {
                    if tags.iter().any(|x| x == t) {
                        self.backend.resume(self, t)?;
                        // A partial resume is recorded, so a retry resumes only what is out.
                        let _ = lock(&self.state).machine.resume(&[t]);
                    }
                }
                Ok(())
            },
        )
    }

    fn apply_weight_update(&self, update: WeightUpdate) -> Result<UpdateReport> {
        self.update(&update)
    }

    fn load_adapter(&self, name: String, dir: String) -> Result<()> {
        self.load_lora(&name, &dir)
    }

    fn unload_adapter(&self, name: String) -> Result<()> {
        self.unload_lora(&name)
    }

    fn stats(&self) -> Result<ComponentStats> {
        let (started, pid) = {
            let s = lock(&self.server);
            (s.is_some(), s.as_ref().and_then(Server::pid))
        };
        let st = lock(&self.state);
        let mut metrics: Vec<Metric> = st.metrics.iter().map(|(n, v)| Metric::new(n, *v)).collect();
        if let Some(pid) = pid {
            metrics.push(Metric::new("server_pid", f64::from(pid)));
        }
        let state = match (started, st.machine.state()) {
            (false, _) => "stopped",
            (true, EngineState::Serving) => "serving",
            (true, EngineState::Released(_)) => "released",
            (true, _) => "paused",
        };
        Ok(ComponentStats {
            weight_version: st.version,
            state: state.into(),
            metrics: metrics.into(),
        })
    }
}
