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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use serde_json::{Value, json};
use tandem_plugin_api::lifecycle::{EngineMachine, EngineState, TransitionError};
use tandem_plugin_api::sdk::{EngineImpl, Result};
use tandem_plugin_api::{
    ComponentConfig, ComponentStats, EngineHealth, ErrorCode, GenerateRequest, GenerateResponse,
    HostBox, LogLevel, Metric, PauseMode, PluginError, RVec, UpdatePayload, UpdateReport,
    WeightUpdate,
};

use crate::http::{CallError, Client};
use crate::options::{CheckpointApply, SERVED_NAME, VllmOptions, log_path};
use crate::response;
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

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
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

    fn log(&self, level: LogLevel, msg: &str) {
        self.host.log(level, "vllm".into(), msg.into());
    }

    /// Starts the server if it is not running; returns its client (or the dead server's
    /// error with the log tail).
    fn client(&self) -> Result<Client> {
        let mut slot = lock(&self.server);
        if let Some(s) = slot.as_ref() {
            if let Some(e) = s.dead_error() {
                return Err(e);
            }
            return Ok(s.client.clone());
        }
        let dir = lock(&self.state).served_dir.clone();
        let server = self.launch(&dir)?;
        let client = server.client.clone();
        *slot = Some(server);
        drop(slot);
        let version = lock(&self.state).version;
        self.report_version(&client, version)?;
        Ok(client)
    }

    fn launch(&self, dir: &Path) -> Result<Server> {
        self.log(
            LogLevel::Info,
            &format!(
                "starting vLLM for rank {} on {} (log {})",
                self.rank,
                dir.display(),
                self.log.display()
            ),
        );
        let server = Server::launch(&self.opts, dir, &self.tokenizer, self.rank, &self.log)?;
        self.log(
            LogLevel::Info,
            &format!(
                "vLLM rank {} healthy at {} after {:.1} s (pid {})",
                self.rank,
                server.client.base(),
                server.startup_s,
                server.pid
            ),
        );
        lock(&self.state).set_metric("startup_s", server.startup_s);
        Ok(server)
    }

    /// Maps a failed call: a dead server becomes its own error with the log tail.
    fn call_error(&self, e: CallError, what: &str) -> PluginError {
        if matches!(e, CallError::Connect(_)) {
            // Give the supervisor a moment to record the exit.
            std::thread::sleep(std::time::Duration::from_millis(300));
            if let Some(dead) = lock(&self.server).as_ref().and_then(Server::dead_error) {
                return dead;
            }
        }
        e.to_plugin(what)
    }

    fn post(&self, path: &str, body: Option<&Value>, control: bool) -> Result<String> {
        let client = self.client()?;
        let timeout = if control {
            self.opts.control_timeout()
        } else {
            self.opts.request_timeout()
        };
        client
            .post(path, body, timeout)
            .map_err(|e| self.call_error(e, &format!("POST {path}")))
    }

    fn post_json(&self, path: &str, body: &Value, control: bool) -> Result<Value> {
        let text = self.post(path, Some(body), control)?;
        serde_json::from_str(&text).map_err(|e| {
            PluginError::runtime(format!(
                "engine `vllm`: POST {path}: answer is not JSON ({e}): {}",
                text.chars().take(200).collect::<String>()
            ))
        })
    }

    fn report_version(&self, client: &Client, version: u64) -> Result<()> {
        client
            .post(
                "/update_weight_version",
                Some(&json!({ "new_version": version.to_string() })),
                self.opts.control_timeout(),
            )
            .map_err(|e| self.call_error(e, "POST /update_weight_version"))?;
        Ok(())
    }

    fn begin(&self) -> Result<()> {
        let st = lock(&self.state);
        if !st.machine.can_generate() {
            return Err(PluginError::invalid_state(format!(
                "engine `vllm` is {}, not serving; call continue_generation first",
                st.machine.state()
            )));
        }
        Ok(())
    }

    /// `/reset_prefix_cache`.
    fn flush_prefix_cache(&self) -> Result<()> {
        let v = self.post_json("/reset_prefix_cache", &json!({}), true);
        // Older servers answer an empty body; a JSON answer must say success.
        match v {
            Ok(v) if v.get("success") == Some(&Value::Bool(false)) => Err(PluginError::new(
                ErrorCode::InvalidState,
                "engine `vllm`: /reset_prefix_cache refused (requests still running)",
            )
            .with_help("pause the engine before flushing its cache")),
            Ok(_) => Ok(()),
            Err(e) if e.code == ErrorCode::Runtime && e.message.contains("not JSON") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The update itself (the lifecycle check is the caller's).
    fn apply_update(&self, update: &WeightUpdate) -> Result<UpdateReport> {
        let started = Instant::now();
        let bytes = match &update.payload {
            UpdatePayload::Adapter { name, dir } => {
                self.require_lora("an adapter update")?;
                let previous = lock(&self.state).active_adapter.clone();
                self.load_adapter(name.to_string(), dir.to_string())?;
                lock(&self.state).active_adapter = Some(name.to_string());
                if let Some(prev) = previous.filter(|p| p.as_str() != name.as_str()) {
                    self.unload_adapter(prev)?;
                    lock(&self.state).active_adapter = Some(name.to_string());
                }
                let secs = started.elapsed().as_secs_f64();
                lock(&self.state).set_metric("adapter_update_s", secs);
                dir_bytes(Path::new(dir.as_str()))
            }
            UpdatePayload::CheckpointDir { dir } => {
                let dir = PathBuf::from(dir.as_str());
                self.check_checkpoint(&dir)?;
                if self.opts.checkpoint_apply == CheckpointApply::Restart {
                    self.restart_on(&dir)?;
                    lock(&self.state).set_metric("restart_s", started.elapsed().as_secs_f64());
                } else {
                    self.reload_in_place(&dir)?;
                    lock(&self.state).set_metric("reload_s", started.elapsed().as_secs_f64());
                }
                lock(&self.state).served_dir = dir.clone();
                dir_bytes(&dir)
            }
            other => {
                return Err(PluginError::not_supported(
                    &format!("apply_weight_update({})", other.kind().as_str()),
                    "vllm",
                )
                .with_help("use the `lora` or `checkpoint` bridge with engine `vllm` on CPU"));
            }
        };
        let client = self.client()?;
        self.report_version(&client, update.version)?;
        lock(&self.state).version = update.version;
        Ok(UpdateReport {
            version: update.version,
            digest: Default::default(),
            bytes_copied: bytes,
        })
    }

    fn require_lora(&self, op: &str) -> Result<()> {
        if self.opts.enable_lora {
            Ok(())
        } else {
            Err(PluginError::new(
                ErrorCode::NotSupported,
                format!("engine `vllm`: {op} needs LoRA enabled"),
            )
            .with_help(
                "set enable_lora = true (and max_lora_rank ≥ the adapter's r) in [engine] options",
            ))
        }
    }

    fn reload_in_place(&self, dir: &Path) -> Result<()> {
        let was_paused = !lock(&self.state).machine.can_generate();
        if !was_paused {
            self.post("/pause?mode=wait", None, false)?;
        }
        let res = self
            .post_json(
                "/collective_rpc",
                &json!({
                    "method": "tandem_reload_weights",
                    "kwargs": { "weights_path": dir.display().to_string() },
                    "timeout": self.opts.control_timeout_s,
                }),
                true,
            )
            .and_then(|_| self.post("/reset_prefix_cache", None, true).map(drop));
        if !was_paused {
            self.post("/resume", None, true)?;
        }
        res
    }

    fn restart_on(&self, dir: &Path) -> Result<()> {
        let mut slot = lock(&self.server);
        if let Some(mut old) = slot.take() {
            old.stop();
        }
        let server = self.launch(dir)?;
        *slot = Some(server);
        let mut st = lock(&self.state);
        st.adapters.clear();
        st.active_adapter = None;
        Ok(())
    }

    fn check_checkpoint(&self, dir: &Path) -> Result<()> {
        let has_weights = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            })
            .unwrap_or(false);
        if !has_weights {
            return Err(PluginError::invalid_input(format!(
                "engine `vllm`: checkpoint {} holds no *.safetensors",
                dir.display()
            ))
            .with_help("export a full Hugging Face checkpoint from the trainer"));
        }
        Ok(())
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
        let started = lock(&self.server).is_some();
        if !started {
            return Ok(EngineHealth {
                ready: false,
                weight_version: lock(&self.state).version,
                detail: "vLLM server not started".into(),
            });
        }
        let client = self.client()?;
        let info = client
            .get("/weight_info", self.opts.control_timeout())
            .map_err(|e| self.call_error(e, "GET /weight_info"))?;
        let reported = serde_json::from_str::<Value>(&info)
            .ok()
            .and_then(|v| v.get("weight_version")?.as_str()?.parse::<u64>().ok());
        let st = lock(&self.state);
        let Some(version) = reported else {
            return Err(PluginError::runtime(format!(
                "engine `vllm`: the server reports weight version {info}, not a Tandem version"
            )));
        };
        Ok(EngineHealth {
            ready: st.machine.can_generate(),
            weight_version: version,
            detail: format!(
                "{} at {} serving {} (log {})",
                st.machine.state().to_string().to_lowercase(),
                client.base(),
                st.served_dir.display(),
                self.log.display()
            )
            .into(),
        })
    }

    fn shutdown(&self) -> Result<()> {
        if let Some(mut s) = lock(&self.server).take() {
            s.stop();
        }
        Ok(())
    }

    fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        if request.sampling.return_hidden_states {
            return Err(PluginError::not_supported(
                "generate with return_hidden_states",
                "vllm",
            ));
        }
        self.begin()?;
        if request.prompts.iter().any(|p| p.is_empty()) {
            return Err(PluginError::invalid_input(
                "engine `vllm`: generate: a prompt is empty",
            ));
        }
        let (model, version) = {
            let st = lock(&self.state);
            let model = request
                .adapter
                .as_ref()
                .map(|a| a.to_string())
                .into_option()
                .or_else(|| st.active_adapter.clone())
                .unwrap_or_else(|| SERVED_NAME.to_owned());
            (model, st.version)
        };
        if request.prompts.is_empty() {
            return Ok(GenerateResponse {
                completions: RVec::new(),
                weight_version: version,
            });
        }
        let body = response::completion_body(&model, &request);
        let v = self.post_json("/v1/completions", &body, false)?;
        let completions =
            response::completions(&v, request.prompts.len(), request.sampling.logprobs)?;
        Ok(GenerateResponse {
            completions: completions.into(),
            weight_version: version,
        })
    }

    fn score(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        self.begin()?;
        if sequences.iter().any(|s| s.is_empty()) {
            return Err(PluginError::invalid_input(
                "engine `vllm`: score: a sequence is empty",
            ));
        }
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let model = lock(&self.state)
            .active_adapter
            .clone()
            .unwrap_or_else(|| SERVED_NAME.to_owned());
        // vLLM 0.32's CPU LoRA logits path (punica_cpu `add_lora_logits`) mis-sizes prompt
        // logprobs of several sequences batched in one step and kills the engine core
        // ("einsum(): subscript b has size 2 ... size 5"), adapter active or not. With LoRA on,
        // each sequence is scored in a request of its own, one after the other.
        let per_request = if self.opts.enable_lora {
            1
        } else {
            sequences.len()
        };
        let mut out = Vec::with_capacity(sequences.len());
        for chunk in sequences.chunks(per_request) {
            let body = response::score_body(&model, chunk);
            let v = self.post_json("/v1/completions", &body, false)?;
            out.extend(response::prompt_logprobs(&v, chunk)?);
        }
        Ok(out)
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
        self.require_lora("load_adapter")?;
        if !Path::new(&dir).join("adapter_config.json").is_file() {
            return Err(PluginError::invalid_input(format!(
                "engine `vllm`: adapter directory {dir} has no adapter_config.json"
            ))
            .with_help(
                "give a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)",
            ));
        }
        let reload = lock(&self.state).adapters.contains(&name);
        let started = Instant::now();
        self.post(
            "/v1/load_lora_adapter",
            Some(&json!({ "lora_name": name, "lora_path": dir, "load_inplace": reload })),
            true,
        )?;
        let mut st = lock(&self.state);
        st.set_metric("lora_load_s", started.elapsed().as_secs_f64());
        st.adapters.insert(name);
        Ok(())
    }

    fn unload_adapter(&self, name: String) -> Result<()> {
        self.require_lora("unload_adapter")?;
        self.post(
            "/v1/unload_lora_adapter",
            Some(&json!({ "lora_name": name })),
            true,
        )?;
        let mut st = lock(&self.state);
        st.adapters.remove(&name);
        if st.active_adapter.as_deref() == Some(name.as_str()) {
            st.active_adapter = None;
        }
        Ok(())
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
