//! Each bridge's `[bridge.options]`, parsed the same way by `validate_config` (what `tandem
//! check` asks) and by the constructor.

use serde::Deserialize;
use tandem_plugin_api::sdk::parse_options;
use tandem_plugin_api::{ComponentConfig, ConfigProblem};

/// A bridge component with its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Options {
    Ipc,
    Lora,
    Checkpoint { restart: bool },
    Broadcast { bucket_bytes: u64 },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoOptions {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointOptions {
    #[serde(default = "yes")]
    restart: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BroadcastOptions {
    #[serde(default = "default_bucket_mb")]
    bucket_mb: f64,
}

/// 64 MiB: large enough that per-bucket latency (two broadcasts, a checksum) is noise beside
/// the copy, small enough that two buckets per engine are a small share of a model.
fn default_bucket_mb() -> f64 {
    64.0
}

impl Options {
    pub(crate) fn parse(config: &ComponentConfig) -> Result<Options, ConfigProblem> {
        let json = config.options_json.as_str();
        match config.component.as_str() {
            "ipc" => parse_options::<NoOptions>(json).map(|_| Options::Ipc),
            "lora" => parse_options::<NoOptions>(json).map(|_| Options::Lora),
            "checkpoint" => parse_options::<CheckpointOptions>(json)
                .map(|o| Options::Checkpoint { restart: o.restart }),
            "broadcast" => {
                let o = parse_options::<BroadcastOptions>(json)?;
                if !(o.bucket_mb.is_finite() && o.bucket_mb >= 0.001 && o.bucket_mb <= 65536.0) {
                    return Err(ConfigProblem::new(
                        "bucket_mb",
                        format!("must be between 0.001 and 65536 MiB, not {}", o.bucket_mb),
                    )
                    .with_help("the bucket size in MiB; 64 is a good start"));
                }
                Ok(Options::Broadcast {
                    bucket_bytes: (o.bucket_mb * 1048576.0) as u64,
                })
            }
            other => Err(ConfigProblem::new(
                "",
                format!("plugin `bridges` has no bridge `{other}`"),
            )
            .with_help("its bridges: ipc, lora, checkpoint, broadcast")),
        }
    }
}
