//! Logging setup: `tracing` to stderr, pretty or JSON, verbosity from `-v`/`-q` (overridden by
//! `RUST_LOG`).

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. `verbosity`: 0 = warn, 1 = info, 2 = debug, 3+ = trace;
/// negative = error only.
pub fn init(format: LogFormat, verbosity: i8) {
    let level = match verbosity {
        i8::MIN..=-1 => "error",
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (e.g. in tests calling cli::main twice) keeps the first subscriber.
    let _ = match format {
        LogFormat::Pretty => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
