//! `tandem serve MODEL_DIR`: an engine that declares it serves (`--engine`, default the first
//! loaded one; its options with `--engine-option`) behind SGLang's and OpenAI's HTTP APIs
//! (`tandem-serve`). Prints `tandem serve: listening on http://HOST:PORT` as the first line
//! on stdout once the socket accepts connections, then serves until SIGINT / SIGTERM.
//! Loopback by default; another address needs an API key.

use crate::error::CliError;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use tandem_serve::{ServeError, ServeOptions};

/// Environment variable holding the API key (instead of `--api-key`).
pub const KEY_ENV: &str = "TANDEM_SERVE_API_KEY";

/// Arguments of `tandem serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory (Hugging Face layout).
    model: PathBuf,
    /// A PEFT LoRA adapter directory loaded at start, served under the directory's name
    /// (OpenAI requests whose `model` names it, SGLang `lora_path`).
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Port (0: any free port).
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Address to bind; anything but loopback needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Bearer token every route but /health* needs (also $TANDEM_SERVE_API_KEY).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Allow /release_memory_occupation and /resume_memory_occupation.
    #[arg(long)]
    enable_memory_saver: bool,
    /// Allow /load_lora_adapter and /unload_lora_adapter.
    #[arg(long)]
    enable_lora: bool,
    /// Initial weight_version label (SGLang's default: "default").
    #[arg(long, value_name = "V")]
    weight_version: Option<String>,
    /// The model's name in responses (default: MODEL_DIR as given).
    #[arg(long, value_name = "N")]
    served_model_name: Option<String>,
    /// The engine component to serve (default: the first loaded engine that declares it
    /// serves; `tandem plugins` lists them).
    #[arg(long, value_name = "NAME")]
    engine: Option<String>,
    /// One of the engine's options, as a TOML `key = value` line (repeatable), e.g.
    /// `--engine-option 'max_batch = 32'`; the engine's plugin checks them.
    #[arg(long = "engine-option", value_name = "KEY = VALUE")]
    engine_options: Vec<String>,
    /// Most sequences one engine call takes from the queue.
    #[arg(long, default_value_t = 256)]
    max_running_requests: usize,
    /// Longest wait (ms) for the previous engine call's clients to send again before a
    /// smaller batch is dispatched (0: dispatch at once).
    #[arg(long, default_value_t = 5)]
    batch_wait_ms: u64,
}

/// `--engine-option` lines as one options object.
fn engine_options(
    lines: &[String],
) -> Result<serde_json::Map<String, serde_json::Value>, CliError> {
    toml::from_str(&lines.join("\n")).map_err(|e| {
        CliError::usage(format!(
            "--engine-option: {}",
            e.message().split_whitespace().collect::<Vec<_>>().join(" ")
        ))
        .with_help("give one TOML `key = value` per flag, e.g. --engine-option 'max_batch = 32'")
    })
}

fn serve_error(e: ServeError) -> CliError {
    match e {
        ServeError::Usage(m) => CliError::usage(m),
        ServeError::Runtime(r) => crate::generate::user_error(CliError::Runtime(r)),
        e @ ServeError::Io { .. } => CliError::failed(e.to_string()),
    }
}

pub(super) fn run(cli_dirs: &[PathBuf], args: ServeArgs) -> Result<(), CliError> {
    let api_key = args
        .api_key
        .clone()
        .or_else(|| std::env::var(KEY_ENV).ok().filter(|k| !k.is_empty()));
    if !tandem_serve::is_loopback(&args.host) && api_key.is_none() {
        return Err(CliError::usage(format!(
            "--host {} is not loopback: give --api-key KEY (or ${KEY_ENV}) to serve beyond \
             this machine",
            args.host
        )));
    }
    if !args.model.join("config.json").is_file() {
        return Err(CliError::usage(format!(
            "{} is not a model directory (no config.json)",
            args.model.display()
        )));
    }
    let opts = ServeOptions {
        model: args.model,
        adapter: args.adapter,
        host: args.host,
        port: args.port,
        api_key,
        memory_saver: args.enable_memory_saver,
        lora: args.enable_lora,
        weight_version: args.weight_version,
        served_model_name: args.served_model_name,
        engine: args.engine,
        engine_options: engine_options(&args.engine_options)?,
        max_running_requests: args.max_running_requests.max(1),
        batch_wait: std::time::Duration::from_millis(args.batch_wait_ms),
        signals: true,
    };
    let registry = super::load_registry(cli_dirs, &[])?;
    let (engine, max_seq_len) = tandem_serve::construct(&registry, &opts).map_err(serve_error)?;
    let running = tandem_serve::start(engine, max_seq_len, &opts).map_err(serve_error)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "tandem serve: listening on {}", running.url())
        .and_then(|()| out.flush())
        .map_err(CliError::io("writing to stdout"))?;
    drop(out);
    running.wait().map_err(serve_error)
}
