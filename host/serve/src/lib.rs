//! `tandem-serve`: any engine component that declares it can serve (its plugin's
//! `describe_config` answers `serves`) as a long-running HTTP server speaking SGLang's native
//! API and OpenAI's `/v1` API — what `tandem serve` runs.
//!
//! - [`construct`] picks the engine ([`pick_engine`]) and builds it through the plugin
//!   registry, in process, exactly as
//!   `tandem generate` does (memory services attached with `--enable-memory-saver`, so
//!   releasing a tag really frees its pages);
//! - [`start`] binds the socket, starts the batcher thread ([`sched`]) and the HTTP server
//!   (axum on a multi-thread tokio runtime, [`http`]) and returns a [`Running`] handle;
//! - [`control`] maps SGLang's lax lifecycle onto the engine's strict state machine.
//!
//! See `host/serve/NOTES.md` for the route table and what differs from real SGLang.

#![forbid(unsafe_code)]

pub mod control;
pub mod error;
pub mod http;
pub mod sched;
pub mod text;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::serve::ListenerExt;
use serde_json::json;
use tandem_memory::{ManagerConfig, MemoryManager};
use tandem_plugin_api::{ComponentConfig, ComponentKind, EngineBox, RString};
use tandem_runtime::registry::Registry;
use tandem_runtime::services::Services;

pub use error::ServeError;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Model directory.
    pub model: PathBuf,
    /// An adapter loaded at start under its directory's name.
    pub adapter: Option<PathBuf>,
    /// Address to bind.
    pub host: String,
    /// Port (0: any free one).
    pub port: u16,
    /// Bearer token required on every route but health probes.
    pub api_key: Option<String>,
    /// Allow `/release_memory_occupation` and `/resume_memory_occupation`.
    pub memory_saver: bool,
    /// Allow `/load_lora_adapter` and `/unload_lora_adapter`.
    pub lora: bool,
    /// Initial `weight_version` label.
    pub weight_version: Option<String>,
    /// The model's name in responses.
    pub served_model_name: Option<String>,
    /// The engine component (`None`: the first loaded engine that declares it serves).
    pub engine: Option<String>,
    /// The engine's options, as the JSON object its plugin receives.
    pub engine_options: serde_json::Map<String, serde_json::Value>,
    /// Most sequences one engine call takes.
    pub max_running_requests: usize,
    /// Longest wait for the previous engine call's clients to send again before dispatching
    /// a smaller batch (see `sched::Server::gather`).
    pub batch_wait: std::time::Duration,
    /// Stop on SIGINT / SIGTERM (the CLI; an in-process server stops with [`Running::stop`]).
    pub signals: bool,
}

/// Whether `host` is a loopback address or name.
pub fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The engine config of `component` for `opts`.
fn engine_config(component: &str, opts: &ServeOptions) -> ComponentConfig {
    ComponentConfig {
        component: component.into(),
        model_path: opts.model.display().to_string().into(),
        options_json: serde_json::Value::Object(opts.engine_options.clone())
            .to_string()
            .into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: RString::new(),
    }
}

/// The engine `tandem serve` runs: `opts.engine`, which must declare it serves with these
/// options, or the first loaded engine that does; with the longest sequence it holds (its
/// `max_seq_len`, 0 when it does not say).
pub fn pick_engine(registry: &Registry, opts: &ServeOptions) -> Result<(String, u32), ServeError> {
    let candidates = match &opts.engine {
        Some(name) => vec![name.clone()],
        None => registry.component_names(ComponentKind::Engine),
    };
    let mut refused = Vec::new();
    for name in candidates {
        if registry.component(ComponentKind::Engine, &name).is_none() {
            let known = registry.component_names(ComponentKind::Engine).join(", ");
            return Err(ServeError::usage(format!(
                "--engine {name}: no loaded plugin provides it (engines: {known})"
            )));
        }
        if let Some(problems) = registry
            .validate_config(ComponentKind::Engine, engine_config(&name, opts))?
            .filter(|p| !p.is_empty())
        {
            let lines: Vec<String> = problems
                .iter()
                .map(|p| format!("--engine-option {p}"))
                .collect();
            return Err(ServeError::usage(format!(
                "engine `{name}`: {}",
                lines.join("; ")
            )));
        }
        match registry.describe_config(ComponentKind::Engine, engine_config(&name, opts))? {
            Some(caps) if caps.serves => return Ok((name, caps.max_seq_len)),
            Some(_) => refused.push(format!("`{name}` does not declare it serves")),
            None => refused.push(format!(
                "`{name}` is below plugin API level 5 (it cannot say whether it serves)"
            )),
        }
        if opts.engine.is_some() {
            break;
        }
    }
    Err(ServeError::usage(format!(
        "no engine to serve: {}",
        if refused.is_empty() {
            "no engine is loaded".to_owned()
        } else {
            refused.join("; ")
        }
    )))
}

/// The chosen engine of `opts.model` through `registry`, with the longest sequence it holds.
pub fn construct(registry: &Registry, opts: &ServeOptions) -> Result<(EngineBox, u32), ServeError> {
    let (name, max_seq_len) = pick_engine(registry, opts)?;
    let config = engine_config(&name, opts);
    let services = if opts.memory_saver {
        Services::with_memory(MemoryManager::new(ManagerConfig::cpu("serve")))
    } else {
        Services::new()
    };
    Ok((registry.new_engine(config, services.handle())?, max_seq_len))
}

/// The model's `max_position_embeddings` (`config.json`), or 2048 when it has none.
fn model_positions(model: &std::path::Path) -> usize {
    std::fs::read_to_string(model.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|c| c["max_position_embeddings"].as_u64())
        .map_or(2048, |n| n as usize)
}

/// A started server.
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// The server state (batcher + engine).
    pub server: Arc<sched::Server>,
    stop: Arc<tokio::sync::Notify>,
    thread: std::thread::JoinHandle<Result<(), ServeError>>,
    batcher: std::thread::JoinHandle<()>,
}

impl Running {
    /// `http://HOST:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until SIGINT / SIGTERM (or [`Running::stop`]) stopped the server.
    pub fn wait(self) -> Result<(), ServeError> {
        let out = self
            .thread
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        self.server.shutdown();
        let _ = self.batcher.join();
        out
    }

    /// Stops the server and waits for it.
    pub fn stop(self) -> Result<(), ServeError> {
        self.stop.notify_one();
        self.wait()
    }
}

fn engine_error(what: &str, e: tandem_plugin_api::PluginError) -> ServeError {
    ServeError::Runtime(tandem_runtime::RuntimeError::plugin(what, e))
}

/// Serves `engine` as `opts` says; returns once the socket accepts connections.
pub fn start(
    engine: EngineBox,
    max_seq_len: u32,
    opts: &ServeOptions,
) -> Result<Running, ServeError> {
    let text = text::ModelText::load(&opts.model)?;
    let health = engine
        .health()
        .into_result()
        .map_err(|e| engine_error("engine health", e))?;
    let version = health.weight_version;
    let label = opts.weight_version.clone().unwrap_or_else(|| {
        if version == 0 {
            "default".into()
        } else {
            version.to_string()
        }
    });
    // What the engine holds; when it does not say, what the model's positions allow.
    let context_len = if max_seq_len > 0 {
        max_seq_len as usize
    } else {
        model_positions(&opts.model)
    };
    let server = sched::Server::new(
        engine,
        version,
        label,
        opts.model.display().to_string(),
        opts.max_running_requests,
        opts.batch_wait,
    );
    if let Some(dir) = &opts.adapter {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| ServeError::usage(format!("--adapter {}: no name", dir.display())))?;
        server
            .load_adapter(&name, &dir.display().to_string())
            .map_err(|e| ServeError::usage(format!("--adapter {}: {e}", dir.display())))?;
    }
    let model_path = opts.model.display().to_string();
    let model_name = opts.served_model_name.clone().unwrap_or(model_path.clone());
    let args = json!({"model_path": model_path, "served_model_name": model_name,
        "host": opts.host, "port": opts.port, "enable_memory_saver": opts.memory_saver,
        "enable_lora": opts.lora || opts.adapter.is_some(),
        "weight_version": opts.weight_version.clone().unwrap_or("default".into()),
        "context_length": context_len, "max_running_requests": opts.max_running_requests,
        "tp_size": 1, "dp_size": 1, "pp_size": 1, "skip_server_warmup": true,
        "api_key": opts.api_key.as_ref().map(|_| "<set>")});
    let app = Arc::new(http::App {
        server: server.clone(),
        text,
        model_name,
        model_path,
        api_key: opts.api_key.clone(),
        memory_saver: opts.memory_saver,
        lora: opts.lora || opts.adapter.is_some(),
        context_len,
        started: http::now(),
        args,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tandem-serve")
        .build()
        .map_err(ServeError::io("starting the HTTP runtime"))?;
    let bind = format!("{}:{}", opts.host, opts.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&bind))
        .map_err(ServeError::io(format!("binding {bind}")))?;
    let addr = listener
        .local_addr()
        .map_err(ServeError::io("reading the bound address"))?;
    let batcher = {
        let server = server.clone();
        std::thread::Builder::new()
            .name("tandem-serve-engine".into())
            .spawn(move || server.run_batcher())
            .map_err(ServeError::io("starting the engine thread"))?
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let thread = {
        let (stop, server, signals) = (stop.clone(), server.clone(), opts.signals);
        std::thread::Builder::new()
            .name("tandem-serve-http".into())
            .spawn(move || {
                rt.block_on(async move {
                    let shutdown = async move {
                        stopped(&stop, signals).await;
                        server.shutdown();
                    };
                    // Small JSON answers: send each write at once (no Nagle delay).
                    let listener = listener.tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    axum::serve(listener, http::router(app))
                        .with_graceful_shutdown(shutdown)
                        .await
                        .map_err(ServeError::io("serving HTTP"))
                })
            })
            .map_err(ServeError::io("starting the HTTP thread"))?
    };
    Ok(Running {
        addr,
        server,
        stop,
        thread,
        batcher,
    })
}

/// Resolves on SIGINT, SIGTERM or a `stop` notification.
async fn stopped(stop: &tokio::sync::Notify, signals: bool) {
    if !signals {
        stop.notified().await;
        return;
    }
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
        _ = stop.notified() => {}
    }
}
