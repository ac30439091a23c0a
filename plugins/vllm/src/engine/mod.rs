//! The `vllm` engine: the shared server-engine kit
//! ([`tandem_plugin_support::server_engine`]) driving one supervised vLLM OpenAI server per
//! rank. This module is what is vLLM's own: how the server starts, `health` from its
//! `/weight_info`, and the lifecycle routes (`/pause?mode=…`, `/resume`,
//! `/reset_prefix_cache`). Generation while paused fails with `InvalidState` in the kit
//! (vLLM itself would answer 503). Memory release is not declared on CPU (vLLM's CPU worker
//! frees nothing in sleep mode), so `release_memory`/`resume_memory` answer `NotSupported`.
//!
//! `serve.rs`: `/v1/completions` for generate and score; `update.rs`: checkpoint reload in
//! place or restart, adapter routes, the version label.

mod serve;
mod update;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{Completion, ComponentConfig, EngineHealth, ErrorCode};
use tandem_plugin_api::{HostBox, PauseMode, PluginError, RVec, UpdatePayload, WeightUpdate};
use tandem_plugin_support::server_engine::launch::{Health, LaunchSpec};
use tandem_plugin_support::server_engine::{Backend, Client, Deadline, Dialect, Server};
use tandem_plugin_support::server_engine::{Checkpoint, Generation, Scoring};
use tandem_plugin_support::server_engine::{ServerEngine, Settings};

use crate::options::{EXTENSION_CLASS, EXTENSION_MODULE, VllmOptions};

/// The `vllm` engine component.
pub type VllmEngine = ServerEngine<Vllm>;

/// What is vLLM's own in the engine: its options and the original model directory.
pub struct Vllm {
    opts: VllmOptions,
    /// The original model directory: tokenizer files for every server, also on checkpoints.
    tokenizer: PathBuf,
}

/// vLLM's names; a 503 is a paused or sleeping server.
pub static DIALECT: Dialect = Dialect::new("vllm", "vLLM", "vLLM 0.32 with VLLM_SERVER_DEV_MODE=1")
    .with_503(ErrorCode::InvalidState);

/// Writes the worker extension module next to the logs (`<run_dir>/vllm-ext/`) and returns
/// its directory (put on the server's `PYTHONPATH`).
fn write_extension(log: &Path) -> Result<PathBuf> {
    let base = log
        .parent()
        .and_then(Path::parent)
        .map_or_else(std::env::temp_dir, Path::to_path_buf);
    let dir = base.join("vllm-ext");
    let (name, text) = EXTENSION_MODULE;
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(name), text))
        .map_err(|e| {
            PluginError::io(format!(
                "engine `vllm`: writing the worker extension into {}: {e}",
                dir.display()
            ))
        })?;
    Ok(dir)
}

impl Vllm {
    /// Launches a server on `dir` (tokenizer from the original model directory) and waits for
    /// `/health`.
    fn launch(&self, engine: &VllmEngine, dir: &Path) -> Result<Server> {
        engine.launching(dir);
        let log = engine.log_file();
        let ext_dir = write_extension(log)?;
        let python_path = match std::env::var("PYTHONPATH") {
            Ok(p) if !p.is_empty() => format!("{}:{p}", ext_dir.display()),
            _ => ext_dir.display().to_string(),
        };
        let mut env = vec![("PYTHONPATH".to_owned(), python_path)];
        env.extend(self.opts.server_env());
        let spec = LaunchSpec {
            dialect: &DIALECT,
            launcher: self.opts.launcher()?,
            package: "vllm",
            python_help: "run `bash scripts/setup.sh` (scripts/setup-python.sh creates the \
                          venv), or point `python` in [engine] options or $TANDEM_PYTHON at the \
                          venv's python",
            install_help: "create the venv with `bash scripts/setup.sh` (scripts/setup-python.sh) \
                           and point `python` / $TANDEM_PYTHON at its python, or unset them to \
                           use the one it records",
            model: dir,
            host: &self.opts.host,
            port: self.opts.port,
            rank: engine.rank(),
            log,
            env,
            api_key: None,
            trace: None,
            health: Health {
                route: "/health",
                probe: Duration::from_secs(5),
                timeout: Duration::from_secs(self.opts.startup_timeout_s),
                option: "startup_timeout_s",
                exit_help: "read the log for vLLM's own error",
            },
        };
        Server::launch(spec, |port| {
            let mut a = self
                .opts
                .server_args(dir, &self.tokenizer, port, engine.rank());
            a.extend(["--worker-extension-cls".into(), EXTENSION_CLASS.into()]);
            a
        })
    }

    /// Labels the served weights with `version` (`health` reads it back).
    fn report_version(&self, engine: &VllmEngine, client: &Client, version: u64) -> Result<()> {
        client
            .post(
                "/update_weight_version",
                Some(&json!({ "new_version": version.to_string() })),
                engine.timeout(Deadline::Control),
            )
            .map_err(|e| engine.call_error(e, "POST /update_weight_version"))?;
        Ok(())
    }
}

impl Backend for Vllm {
    const DIALECT: &'static Dialect = &DIALECT;
    const LORA_HELP: &'static str =
        "set enable_lora = true (and max_lora_rank ≥ the adapter's r) in [engine] options";
    const RELOADS_ADAPTERS: bool = true;

    /// Validates the options and the model directory; the server starts on `start` (or the
    /// first call that needs it).
    fn engine(config: &ComponentConfig, host: HostBox) -> Result<VllmEngine> {
        let opts = VllmOptions::parse(&config.options_json)?;
        if config.model_path.is_empty() {
            return Err(PluginError::invalid_input(
                "engine `vllm` needs a model directory (model_path is empty)",
            ));
        }
        opts.launcher()?;
        let tokenizer = PathBuf::from(config.model_path.as_str());
        let settings = Settings {
            request_timeout_s: opts.request_timeout_s,
            control_timeout_s: opts.control_timeout_s,
            lora: opts.enable_lora,
        };
        Ok(ServerEngine::new(
            Vllm { opts, tokenizer },
            settings,
            config,
            host,
        ))
    }

    fn start(&self, engine: &VllmEngine) -> Result<Server> {
        let dir = engine.state().served_dir.clone();
        self.launch(engine, &dir)
    }

    fn started(&self, engine: &VllmEngine, client: &Client) -> Result<()> {
        let version = engine.state().version;
        self.report_version(engine, client, version)
    }

    fn health(&self, engine: &VllmEngine) -> Result<EngineHealth> {
        let client = engine.client()?;
        let info = engine
            .get("/weight_info")?
            .map_err(|e| engine.call_error(e, "GET /weight_info"))?;
        let reported = serde_json::from_str::<Value>(&info)
            .ok()
            .and_then(|v| v.get("weight_version")?.as_str()?.parse::<u64>().ok());
        let Some(version) = reported else {
            return Err(PluginError::runtime(format!(
                "engine `vllm`: the server reports weight version {info}, not a Tandem version"
            )));
        };
        let st = engine.state();
        Ok(EngineHealth {
            ready: st.machine.can_generate(),
            weight_version: version,
            detail: format!(
                "{} at {} serving {} (log {})",
                st.machine.state().to_string().to_lowercase(),
                client.base(),
                st.served_dir.display(),
                engine.log_file().display()
            )
            .into(),
        })
    }

    fn pause(&self, engine: &VllmEngine, mode: PauseMode) -> Result<()> {
        // vLLM drains a `wait` pause itself: it may take as long as a request.
        let d = match mode {
            PauseMode::Wait => Deadline::Request,
            _ => Deadline::Control,
        };
        let path = format!("/pause?mode={}", mode.as_str());
        engine.post(&path, None, d).map(drop)
    }

    fn continue_generation(&self, engine: &VllmEngine) -> Result<()> {
        engine.post("/resume", None, Deadline::Control).map(drop)
    }

    /// `/reset_prefix_cache`.
    fn flush(&self, engine: &VllmEngine) -> Result<()> {
        let v = engine.post_json("/reset_prefix_cache", &json!({}), Deadline::Control);
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

    /// Memory release is declared only where it frees memory: not on vLLM's CPU worker.
    fn check_memory(&self, op: &str, tags: &[String]) -> Result<()> {
        Err(
            PluginError::not_supported(&format!("{op}({})", tags.join(", ")), "vllm").with_help(
                "vLLM's CPU worker frees no memory in sleep mode; run the engine with \
                 needs_offload = false (CUDA sleep mode is designed, see plugins/vllm/NOTES.md)",
            ),
        )
    }

    fn release(&self, _engine: &VllmEngine, tags: &[String]) -> Result<()> {
        self.check_memory("release_memory", tags)
    }

    fn resume(&self, _engine: &VllmEngine, tag: &str) -> Result<()> {
        self.check_memory("resume_memory", &[tag.to_owned()])
    }

    fn generate(&self, engine: &VllmEngine, job: Generation<'_>) -> Result<Vec<Completion>> {
        self.complete(engine, job.request, job.adapter)
    }

    fn score(&self, engine: &VllmEngine, job: Scoring<'_>) -> Result<Vec<RVec<f32>>> {
        self.prompt_logprobs(engine, job.sequences, job.adapter)
    }

    fn unsupported_update(&self, payload: &UpdatePayload) -> PluginError {
        update::unsupported(payload)
    }

    /// vLLM reports no digest of what it loaded.
    fn load_checkpoint(&self, engine: &VllmEngine, job: Checkpoint<'_>) -> Result<String> {
        self.apply_checkpoint(engine, job.dir)
            .map(|()| String::new())
    }

    fn load_adapter(&self, engine: &VllmEngine, name: &str, dir: &str, loaded: bool) -> Result<()> {
        self.load_lora(engine, name, dir, loaded)
    }

    fn unload_adapter(&self, engine: &VllmEngine, name: &str) -> Result<()> {
        engine
            .post(
                "/v1/unload_lora_adapter",
                Some(&json!({ "lora_name": name })),
                Deadline::Control,
            )
            .map(drop)
    }

    fn settle_version(&self, engine: &VllmEngine, update: &WeightUpdate) -> Result<()> {
        let client = engine.client()?;
        self.report_version(engine, &client, update.version)
    }
}
