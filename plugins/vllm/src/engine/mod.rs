//! The `vllm` engine component: [`EngineImpl`] mapped onto one supervised vLLM OpenAI server
//! (see `plugins/vllm/NOTES.md` for the route each call uses and what was measured on CPU).
//!
//! Concurrency: the server slot is locked only to start, stop or read the client; HTTP calls
//! run outside every lock, so `pause_generation` from one thread reaches vLLM while another
//! waits in `generate`. Which lifecycle call is legal when is the shared [`EngineMachine`]'s
//! decision (the host checks the same machine and `tandem-conformance` holds this engine to
//! it): generation while paused fails with `InvalidState` here (vLLM itself would answer 503),
//! flush only right after a pause, updates only while paused and never to a lower version.
//! Memory release is not declared on CPU (vLLM's CPU worker frees nothing in sleep mode), so
//! `release_memory`/`resume_memory` answer `NotSupported`.
//!
//! One file per concern: `calls.rs` (the server slot and HTTP calls), `serve.rs` (health,
//! generate, score), `update.rs` (weight updates and adapters); the lifecycle calls, which
//! only move the machine around one route each, are here.

mod calls;
mod serve;
mod update;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tandem_plugin_api::lifecycle::{EngineMachine, EngineState, TransitionError};
use tandem_plugin_api::sdk::{EngineImpl, Result};
use tandem_plugin_api::{
    ComponentConfig, ComponentStats, EngineHealth, GenerateRequest, GenerateResponse, HostBox,
    Metric, PauseMode, PluginError, RVec, UpdateReport, WeightUpdate,
};

use crate::options::{VllmOptions, log_path};
use crate::server::Server;

struct State {
    machine: EngineMachine,
    version: u64,
    served_dir: PathBuf,
    active_adapter: Option<String>,
    adapters: BTreeSet<String>,
    metrics: Vec<(&'static str, f64)>,
}

fn illegal(e: TransitionError) -> PluginError {
    PluginError::invalid_state(format!("engine `vllm`: {e}"))
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
pub struct VllmEngine {
    opts: VllmOptions,
    rank: u32,
    log: PathBuf,
    /// The original model directory: tokenizer files for every server, also on checkpoints.
    tokenizer: PathBuf,
    host: HostBox,
    server: Mutex<Option<Server>>,
    state: Mutex<State>,
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

impl VllmEngine {
    /// Validates the options and the model directory; the server starts on `start` (or the
    /// first call that needs it).
    pub fn new(config: &ComponentConfig, host: HostBox) -> Result<Self> {
        let opts = VllmOptions::parse(&config.options_json)?;
        if config.model_path.is_empty() {
            return Err(PluginError::invalid_input(
                "engine `vllm` needs a model directory (model_path is empty)",
            ));
        }
        let dir = PathBuf::from(config.model_path.as_str());
        opts.launcher()?;
        Ok(VllmEngine {
            rank: config.rank,
            log: log_path(config.run_dir.as_str(), config.rank),
            tokenizer: dir.clone(),
            host,
            state: Mutex::new({
                let version = saved_version(&dir).unwrap_or(0);
                State {
                    machine: EngineMachine::new(version),
                    version,
                    served_dir: dir,
                    active_adapter: None,
                    adapters: BTreeSet::new(),
                    metrics: Vec::new(),
                }
            }),
            server: Mutex::new(None),
            opts,
        })
    }
}

impl EngineImpl for VllmEngine {
    fn component(&self) -> &str {
        "vllm"
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
        // Paused before the call, so no new request starts while vLLM drains; back to
        // Serving if the server refuses.
        let before = {
            let mut st = lock(&self.state);
            let before = st.machine.clone();
            st.machine.pause().map_err(illegal)?;
            before
        };
        let wait = matches!(mode, PauseMode::Wait);
        let res = self.post(&format!("/pause?mode={}", mode.as_str()), None, !wait);
        if res.is_err() {
            lock(&self.state).machine = before;
        }
        res.map(drop)
    }

    fn continue_generation(&self) -> Result<()> {
        let mut next = lock(&self.state).machine.clone();
        next.continue_generation().map_err(illegal)?;
        self.post("/resume", None, true)?;
        lock(&self.state).machine = next;
        Ok(())
    }

    fn flush_cache(&self) -> Result<()> {
        let mut next = lock(&self.state).machine.clone();
        next.flush().map_err(illegal)?;
        self.flush_prefix_cache()?;
        lock(&self.state).machine = next;
        Ok(())
    }

    fn release_memory(&self, tags: Vec<String>) -> Result<()> {
        Err(no_release("release_memory", &tags))
    }

    fn resume_memory(&self, tags: Vec<String>) -> Result<()> {
        Err(no_release("resume_memory", &tags))
    }

    fn apply_weight_update(&self, update: WeightUpdate) -> Result<UpdateReport> {
        // `Updating` while the update runs: concurrent lifecycle calls are refused meanwhile.
        lock(&self.state)
            .machine
            .begin_update(update.version)
            .map_err(illegal)?;
        let result = self.apply_update(&update);
        lock(&self.state).machine.finish_update(result.is_ok());
        result
    }

    fn load_adapter(&self, name: String, dir: String) -> Result<()> {
        self.load_lora(name, dir)
    }

    fn unload_adapter(&self, name: String) -> Result<()> {
        self.unload_lora(name)
    }

    fn stats(&self) -> Result<ComponentStats> {
        let pid = lock(&self.server).as_ref().map(|s| s.pid);
        let st = lock(&self.state);
        let mut metrics: Vec<Metric> = st.metrics.iter().map(|(n, v)| Metric::new(n, *v)).collect();
        if let Some(pid) = pid {
            metrics.push(Metric::new("server_pid", f64::from(pid)));
        }
        let state = match (pid, st.machine.state()) {
            (None, _) => "stopped",
            (Some(_), EngineState::Serving) => "serving",
            (Some(_), _) => "paused",
        };
        Ok(ComponentStats {
            weight_version: st.version,
            state: state.into(),
            metrics: metrics.into(),
        })
    }
}

/// Memory release is declared only where it frees memory: not on vLLM's CPU worker.
fn no_release(op: &str, tags: &[String]) -> PluginError {
    PluginError::not_supported(&format!("{op}({})", tags.join(", ")), "vllm").with_help(
        "vLLM's CPU worker frees no memory in sleep mode; run the engine with needs_offload = \
         false (CUDA sleep mode is designed, see plugins/vllm/NOTES.md)",
    )
}
