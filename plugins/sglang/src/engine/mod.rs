//! The `sglang` engine component: [`EngineImpl`] mapped onto one SGLang server per engine
//! rank (launched here or attached by URL; see `plugins/sglang/NOTES.md` for the route of
//! every call).
//!
//! Concurrency: the server slot is locked only to start, stop or read the client; HTTP calls
//! run outside every lock, so `pause_generation` from one thread reaches SGLang while another
//! waits in `generate`. Which lifecycle call is legal when is the shared [`EngineMachine`]'s
//! decision, checked *before* the server is called (a flush the machine forbids never reaches
//! SGLang); the machine moves only when the server accepted the call. Generation while
//! paused fails with `InvalidState` here (SGLang itself would hold the request until
//! `/continue_generation`).
//!
//! One file per concern: `calls.rs` (the server slot and HTTP calls), `serve.rs` (health,
//! generate, score, the in-flight count `PauseMode::Wait` waits for), `memory.rs` (pause,
//! flush, release and resume), `update.rs` (weight updates, digests and adapters).

mod calls;
mod memory;
mod serve;
mod update;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tandem_plugin_api::lifecycle::{EngineMachine, EngineState, TransitionError};
use tandem_plugin_api::sdk::{EngineImpl, Result};
use tandem_plugin_api::{
    ComponentConfig, ComponentStats, EngineHealth, GenerateRequest, GenerateResponse, HostBox,
    Metric, PauseMode, PluginError, RVec, UpdateReport, WeightUpdate,
};

use crate::options::{SglangOptions, log_path};
use crate::server::Server;

struct State {
    machine: EngineMachine,
    version: u64,
    /// The checkpoint directory the server serves (launch mode: the model dir at start).
    served_dir: PathBuf,
    /// The adapter generation uses when a request names none (the last adapter update's).
    active_adapter: Option<String>,
    adapters: BTreeSet<String>,
    metrics: Vec<(&'static str, f64)>,
}

fn illegal(e: TransitionError) -> PluginError {
    PluginError::invalid_state(format!("engine `sglang`: {e}"))
}

impl State {
    fn set_metric(&mut self, name: &'static str, value: f64) {
        match self.metrics.iter_mut().find(|(n, _)| *n == name) {
            Some(m) => m.1 = value,
            None => self.metrics.push((name, value)),
        }
    }
}

/// The engine component.
pub struct SglangEngine {
    opts: SglangOptions,
    rank: u32,
    log: PathBuf,
    host: HostBox,
    server: Mutex<Option<Server>>,
    state: Mutex<State>,
    /// Generate / score calls in flight (what `PauseMode::Wait` waits for).
    inflight: Mutex<usize>,
    idle: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Version stored by the trainer in a checkpoint it exported (`tandem_trainer_state.json`).
fn saved_version(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("tandem_trainer_state.json")).ok()?;
    serde_json::from_str::<Value>(&text)
        .ok()?
        .get("weight_version")?
        .as_u64()
}

impl SglangEngine {
    /// Validates the options (and, in launch mode, the launcher); the server starts or is
    /// attached on `start` (or the first call that needs it).
    pub fn new(config: &ComponentConfig, host: HostBox) -> Result<Self> {
        let opts = SglangOptions::parse(&config.options_json, config.world_size.max(1))?;
        let dir = PathBuf::from(config.model_path.as_str());
        if !opts.attach() {
            if config.model_path.is_empty() {
                return Err(PluginError::invalid_input(
                    "engine `sglang` needs a model directory (model_path is empty)",
                )
                .with_help("set [engine] model, or attach to a running server with `url`"));
            }
            opts.launcher()?;
        }
        let version = saved_version(&dir).unwrap_or(0);
        Ok(SglangEngine {
            rank: config.rank,
            log: log_path(config.run_dir.as_str(), config.rank),
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
            opts,
        })
    }
}

impl EngineImpl for SglangEngine {
    fn component(&self) -> &str {
        "sglang"
    }

    fn start(&self) -> Result<()> {
        self.client().map(drop)
    }

    fn health(&self) -> Result<EngineHealth> {
        self.server_health()
    }

    fn shutdown(&self) -> Result<()> {
        if let Some(mut s) = lock(&self.server).take() {
            s.stop();
        }
        Ok(())
    }

    fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        self.complete(request)
    }

    fn score(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        self.score_sequences(sequences)
    }

    fn pause_generation(&self, mode: PauseMode) -> Result<()> {
        self.pause(mode)
    }

    fn continue_generation(&self) -> Result<()> {
        self.resume_generation()
    }

    fn flush_cache(&self) -> Result<()> {
        self.flush()
    }

    fn release_memory(&self, tags: Vec<String>) -> Result<()> {
        self.release(tags)
    }

    fn resume_memory(&self, tags: Vec<String>) -> Result<()> {
        self.resume(tags)
    }

    fn apply_weight_update(&self, update: WeightUpdate) -> Result<UpdateReport> {
        // An undeclared kind (or one the options leave off) is `not_supported` in any state.
        self.check_kind(&update.payload)?;
        // `Updating` while the update runs: concurrent lifecycle calls are refused meanwhile;
        // a version below the served one is refused here, before the server is called.
        lock(&self.state)
            .machine
            .begin_update(update.version)
            .map_err(illegal)?;
        let result = self.apply_update(&update);
        lock(&self.state).machine.finish_update(result.is_ok());
        result
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
