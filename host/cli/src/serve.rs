//! `tandem serve MODEL_DIR`: the native engine behind SGLang's and OpenAI's HTTP APIs
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
    /// Sequences the engine decodes together (its KV-cache slots).
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Longest prompt + completion (capped by the model's RoPE table).
    #[arg(long, default_value_t = 1024)]
    context_length: usize,
    /// Most sequences one engine call takes from the queue.
    #[arg(long, default_value_t = 256)]
    max_running_requests: usize,
    /// Longest wait (ms) for the previous engine call's clients to send again before a
    /// smaller batch is dispatched (0: dispatch at once).
    #[arg(long, default_value_t = 5)]
    batch_wait_ms: u64,
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
        max_batch: args.max_batch.max(1),
        context_length: args.context_length,
        max_running_requests: args.max_running_requests.max(1),
        batch_wait: std::time::Duration::from_millis(args.batch_wait_ms),
        signals: true,
    };
    let registry = super::load_registry(cli_dirs, &[])?;
    let engine = tandem_serve::construct(&registry, &opts).map_err(serve_error)?;
    let running = tandem_serve::start(engine, &opts).map_err(serve_error)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "tandem serve: listening on {}", running.url())
        .and_then(|()| out.flush())
        .map_err(CliError::io("writing to stdout"))?;
    drop(out);
    running.wait().map_err(serve_error)
}
