//! `[bridge.options]` of `squeeze`, parsed by one function that both `validate_config` (what
//! `tandem check` asks) and the constructor call, so a job the check accepts never fails to
//! construct. Unknown keys are refused.

use tandem_plugin_api::serde::Deserialize;
use tandem_plugin_api::{ComponentConfig, ConfigProblem, sdk};

/// The most compression threads a trainer half starts.
pub(crate) const MAX_THREADS: usize = 64;

/// The options as the bridge uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    /// zstd's compression level.
    pub level: i32,
    /// The largest bucket, in bytes (a tensor larger than this travels alone).
    pub bucket_bytes: u64,
    /// Buckets the trainer half compresses at once.
    pub threads: usize,
}

/// `[bridge.options]` as written in the job file.
#[derive(Debug, Deserialize)]
#[serde(crate = "tandem_plugin_api::serde", deny_unknown_fields)]
struct Raw {
    /// zstd level.
    #[serde(default = "default_level")]
    level: i32,
    /// Bucket size in MiB.
    #[serde(default = "default_bucket_mb")]
    bucket_mb: f64,
    /// Compression threads.
    #[serde(default = "default_threads")]
    threads: usize,
}

/// Level 1: zstd's fastest regular level; the shuffle does most of the work on float weights
/// (higher levels gain a few percent at several times the time).
fn default_level() -> i32 {
    1
}

/// 64 MiB, as the built-in `broadcast` bridge: per-bucket costs (a broadcast, a checksum, a
/// compressor reset) are noise beside the compression, and an engine's buffers stay a small
/// share of a model.
fn default_bucket_mb() -> f64 {
    64.0
}

/// One: the trainer's process has its own work, and a CI machine has two cores.
fn default_threads() -> usize {
    1
}

impl Options {
    /// The component's options, or the one problem with them (its key relative to
    /// `[bridge.options]`).
    pub(crate) fn parse(config: &ComponentConfig) -> Result<Options, ConfigProblem> {
        if config.component.as_str() != crate::COMPONENT {
            return Err(ConfigProblem::new(
                "",
                format!(
                    "plugin `example-squeeze` has no bridge `{}`",
                    config.component
                ),
            )
            .with_help("its one bridge: squeeze"));
        }
        let raw: Raw = sdk::parse_options(config.options_json.as_str())?;
        let levels = zstd::compression_level_range();
        if !levels.contains(&raw.level) {
            return Err(ConfigProblem::new(
                "level",
                format!(
                    "zstd levels run from {} to {}, not {}",
                    levels.start(),
                    levels.end(),
                    raw.level
                ),
            )
            .with_help("e.g. level = 1 (fast) or level = 9 (smaller, slower)"));
        }
        let mb = raw.bucket_mb;
        if !(mb.is_finite() && (0.001..=65536.0).contains(&mb)) {
            return Err(ConfigProblem::new(
                "bucket_mb",
                format!("must be between 0.001 and 65536 MiB, not {mb}"),
            )
            .with_help("the bucket size in MiB, e.g. bucket_mb = 64"));
        }
        if !(1..=MAX_THREADS).contains(&raw.threads) {
            return Err(ConfigProblem::new(
                "threads",
                format!("must be between 1 and {MAX_THREADS}, not {}", raw.threads),
            )
            .with_help("buckets compressed at once on the trainer's side, e.g. threads = 4"));
        }
        Ok(Options {
            level: raw.level,
            bucket_bytes: (mb * 1048576.0) as u64,
            threads: raw.threads,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config(component: &str, options_json: &str) -> ComponentConfig {
        ComponentConfig {
            component: component.into(),
            model_path: "".into(),
            options_json: options_json.into(),
            rank: 0,
            world_size: 1,
            device: "cpu".into(),
            run_dir: "".into(),
        }
    }

    fn parse(options_json: &str) -> Result<Options, ConfigProblem> {
        Options::parse(&config("squeeze", options_json))
    }

    #[test]
    fn defaults_are_level_1_64_mib_buckets_and_one_thread() {
        for empty in ["", "{}"] {
            assert_eq!(
                parse(empty).unwrap(),
                Options {
                    level: 1,
                    bucket_bytes: 64 << 20,
                    threads: 1
                }
            );
        }
        let o = parse(r#"{"level": 9, "bucket_mb": 0.5, "threads": 4}"#).unwrap();
        assert_eq!((o.level, o.bucket_bytes, o.threads), (9, 512 << 10, 4));
    }

    #[test]
    fn a_bad_value_is_refused_at_its_key_with_the_value() {
        for (json, key, says) in [
            (r#"{"level": 99}"#, "level", "not 99"),
            (r#"{"level": "fast"}"#, "level", "invalid type"),
            (
                r#"{"bucket_mb": 0}"#,
                "bucket_mb",
                "between 0.001 and 65536",
            ),
            (
                r#"{"bucket_mb": 1e9}"#,
                "bucket_mb",
                "between 0.001 and 65536",
            ),
            (r#"{"threads": 0}"#, "threads", "between 1 and 64, not 0"),
            (r#"{"threads": 65}"#, "threads", "not 65"),
            (r#"{"threads": -1}"#, "threads", "invalid value"),
        ] {
            let p = parse(json).unwrap_err();
            assert_eq!(p.key.as_str(), key, "{json}");
            assert!(p.message.contains(says), "{json}: {p}");
        }
    }

    #[test]
    fn an_unknown_option_is_refused_by_name() {
        let p = parse(r#"{"level": 1, "dictionary": true}"#).unwrap_err();
        assert_eq!(p.key.as_str(), "dictionary");
        assert!(p.message.contains("unknown field"), "{p}");
    }

    #[test]
    fn another_component_name_is_refused() {
        let p = Options::parse(&config("delta", "")).unwrap_err();
        assert!(p.message.contains("no bridge `delta`"), "{p}");
    }
}
