//! The `sglang` engine: the shared server-engine kit
//! ([`tandem_plugin_support::server_engine`]) driving one SGLang server per engine rank,
//! launched here or attached by URL (see `plugins/sglang/NOTES.md` for the route of every
//! call). This module is what is SGLang's own: its names and helps, how the server starts
//! (`attach.rs` for the attach-time checks), `health`, generation and scoring through
//! `/generate`; `memory.rs` holds pause / continue / flush / release / resume, `update.rs`
//! checkpoint loads with their digest check and rollback, the adapter routes and the version
//! label. Generation while paused fails with `InvalidState` in the kit (SGLang itself would
//! hold the request until `/continue_generation`).

mod attach;
mod memory;
mod update;

use std::time::Duration;

use serde_json::json;
use tandem_plugin_api::lifecycle::EngineState;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{Completion, ComponentConfig, EngineHealth, ErrorCode};
use tandem_plugin_api::{HostBox, PauseMode, PluginError, RVec, UpdatePayload, WeightUpdate};
use tandem_plugin_support::server_engine::launch::{Health, LaunchSpec};
use tandem_plugin_support::server_engine::{Backend, CallError, Deadline, Dialect, Server};
use tandem_plugin_support::server_engine::{Checkpoint, Generation, Scoring};
use tandem_plugin_support::server_engine::{ServerEngine, Settings};

use crate::options::SglangOptions;
use crate::response;

/// The `sglang` engine component.
pub type SglangEngine = ServerEngine<Sglang>;

/// What is SGLang's own in the engine: its options.
pub struct Sglang {
    opts: SglangOptions,
}

/// SGLang's names.
pub static DIALECT: Dialect = Dialect::new("sglang", "SGLang", "SGLang 0.5.23 (or tandem serve)");

impl Sglang {
    fn health_wait(&self) -> Health<'static> {
        Health {
            route: "/health_generate",
            probe: Duration::from_secs(20),
            timeout: Duration::from_secs(self.opts.health_timeout_s),
            option: "health_timeout_s",
            exit_help: "read the log; a CPU-only machine cannot run SGLang (attach to a server \
                        with `url`)",
        }
    }

    /// Launch mode: a new server on the served directory at the engine's version.
    fn launch(&self, engine: &SglangEngine) -> Result<Server> {
        let (dir, version) = {
            let st = engine.state();
            (st.served_dir.clone(), st.version)
        };
        engine.launching(&dir);
        let spec = LaunchSpec {
            dialect: &DIALECT,
            launcher: self.opts.launcher()?,
            package: "sglang",
            python_help: "point `python` in [engine] options or $TANDEM_PYTHON at a Python with \
                          SGLang, or attach with `url`",
            install_help: "install sglang (a CUDA machine: `pip install sglang`) and point \
                           `python` at it, or attach to a running server with `url`",
            model: &dir,
            host: &self.opts.host,
            port: self.opts.port,
            rank: engine.rank(),
            log: engine.log_file(),
            env: self.opts.server_env(),
            api_key: self.opts.api_key.clone(),
            trace: self.opts.trace()?,
            health: self.health_wait(),
        };
        Server::launch(spec, |port| {
            self.opts.server_args(&dir, port, engine.rank(), version)
        })
    }
}

impl Backend for Sglang {
    const DIALECT: &'static Dialect = &DIALECT;
    const LORA_HELP: &'static str = "set enable_lora = true (SGLang's --enable-lora, with \
         max_lora_rank and lora_target_modules when it starts without adapters) in [engine] options";
    // SGLang refuses a name already loaded: a re-applied adapter is unloaded first.
    const RELOADS_ADAPTERS: bool = false;

    /// Validates the options (and, in launch mode, the launcher); the server starts or is
    /// attached on `start` (or the first call that needs it).
    fn engine(config: &ComponentConfig, host: HostBox) -> Result<SglangEngine> {
        let opts = SglangOptions::parse(&config.options_json, config.world_size.max(1))?;
        if !opts.attach() {
            if config.model_path.is_empty() {
                return Err(PluginError::invalid_input(
                    "engine `sglang` needs a model directory (model_path is empty)",
                )
                .with_help("set [engine] model, or attach to a running server with `url`"));
            }
            opts.launcher()?;
        }
        let settings = Settings {
            request_timeout_s: opts.request_timeout_s,
            control_timeout_s: opts.control_timeout_s,
            lora: opts.enable_lora,
        };
        Ok(ServerEngine::new(Sglang { opts }, settings, config, host))
    }

    fn start(&self, engine: &SglangEngine) -> Result<Server> {
        match self.opts.url_of(engine.rank()) {
            Some(url) => self.attach(engine, &url),
            None => self.launch(engine),
        }
    }

    fn health(&self, engine: &SglangEngine) -> Result<EngineHealth> {
        // A paused SGLang holds /health_generate's probe request (and marks itself unhealthy
        // after 20 s): it is asked only while serving.
        let serving = engine.state().machine.can_generate();
        let mut unhealthy = None;
        if serving {
            match engine.get("/health_generate")? {
                Ok(_) => {}
                Err(CallError::Status(code, m)) => {
                    unhealthy = Some(format!("GET /health_generate answered {code} {m}"));
                }
                Err(e) => return Err(engine.call_error(e, "GET /health_generate")),
            }
        }
        let served = self.served_version(engine)?;
        let base = engine.client()?.base().to_owned();
        let st = engine.state();
        if served != st.version && !matches!(st.machine.state(), EngineState::Updating { .. }) {
            return Err(PluginError::new(
                ErrorCode::Corrupt,
                format!(
                    "engine `sglang`: GET /model_info: the server at {base} serves weight \
                     version {served}, the engine applied version {}",
                    st.version
                ),
            )
            .with_help("something else updated the server's weights; restart the run"));
        }
        let mut detail = format!(
            "{} at {base}",
            st.machine.state().to_string().to_lowercase()
        );
        if let Some(u) = &unhealthy {
            detail = format!("{detail}: {u}");
        }
        Ok(EngineHealth {
            ready: serving && unhealthy.is_none(),
            weight_version: served,
            detail: detail.into(),
        })
    }

    fn generate(&self, engine: &SglangEngine, job: Generation<'_>) -> Result<Vec<Completion>> {
        let body = response::generate_body(job.request, job.adapter);
        let v = engine.post_json("/generate", &body, Deadline::Request)?;
        let sampling = &job.request.sampling;
        response::completions(&v, job.request.prompts.len(), sampling.logprobs)
    }

    fn score(&self, engine: &SglangEngine, job: Scoring<'_>) -> Result<Vec<RVec<f32>>> {
        let body = response::score_body(job.sequences, job.adapter);
        let v = engine.post_json("/generate", &body, Deadline::Request)?;
        response::scores(&v, job.sequences)
    }

    fn pause(&self, engine: &SglangEngine, mode: PauseMode) -> Result<()> {
        self.pause_route(engine, mode)
    }

    fn continue_generation(&self, engine: &SglangEngine) -> Result<()> {
        engine
            .post("/continue_generation", Some(&json!({})), Deadline::Control)
            .map(drop)
    }

    fn flush(&self, engine: &SglangEngine) -> Result<()> {
        self.flush_route(engine)
    }

    fn check_memory(&self, op: &str, tags: &[String]) -> Result<()> {
        self.check_tags(op, tags)
    }

    fn release(&self, engine: &SglangEngine, tags: &[String]) -> Result<()> {
        let mut sg: Vec<&str> = Vec::new();
        for t in tags {
            sg.extend(memory::sglang_tags(t));
        }
        self.memory_call(engine, "/release_memory_occupation", &sg)
    }

    fn resume(&self, engine: &SglangEngine, tag: &str) -> Result<()> {
        self.memory_call(
            engine,
            "/resume_memory_occupation",
            memory::sglang_tags(tag),
        )
    }

    fn unsupported_update(&self, payload: &UpdatePayload) -> PluginError {
        update::unsupported(payload)
    }

    fn load_checkpoint(&self, engine: &SglangEngine, job: Checkpoint<'_>) -> Result<String> {
        let started = std::time::Instant::now();
        let digest = self.load_checked(engine, job.dir, job.update)?;
        engine
            .state()
            .set_metric("checkpoint_update_s", started.elapsed().as_secs_f64());
        Ok(digest)
    }

    fn load_adapter(
        &self,
        engine: &SglangEngine,
        name: &str,
        dir: &str,
        _loaded: bool,
    ) -> Result<()> {
        self.adapter_route(
            engine,
            "/load_lora_adapter",
            &json!({ "lora_name": name, "lora_path": dir }),
        )
    }

    fn unload_adapter(&self, engine: &SglangEngine, name: &str) -> Result<()> {
        self.adapter_route(
            engine,
            "/unload_lora_adapter",
            &json!({ "lora_name": name }),
        )
    }

    fn settle_version(&self, engine: &SglangEngine, update: &WeightUpdate) -> Result<()> {
        self.settle(engine, update)
    }
}
