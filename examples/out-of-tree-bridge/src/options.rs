//! `[bridge.options]` of `delta`, parsed by one function that both `validate_config` (what
//! `tandem check` asks) and the constructor call, so a job the check accepts never fails to
//! construct. Unknown keys are refused.

use tandem_plugin_api::serde::Deserialize;
use tandem_plugin_api::{ComponentConfig, ConfigProblem, sdk};

/// The options as the bridge uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    /// The largest bucket, in bytes (a tensor larger than this travels alone).
    pub bucket_bytes: u64,
}

/// `[bridge.options]` as written in the job file.
#[derive(Debug, Deserialize)]
#[serde(crate = "tandem_plugin_api::serde", deny_unknown_fields)]
struct Raw {
    /// Bucket size in MiB.
    #[serde(default = "default_bucket_mb")]
    bucket_mb: f64,
}

/// 64 MiB, as the built-in `broadcast` bridge: per-bucket costs (two broadcasts, a checksum)
/// are noise beside the copy, and an engine's receive buffer stays a small share of a model.
fn default_bucket_mb() -> f64 {
    64.0
}

impl Options {
    /// The component's options, or the one problem with them (its key relative to
    /// `[bridge.options]`).
    pub(crate) fn parse(config: &ComponentConfig) -> Result<Options, ConfigProblem> {
        if config.component.as_str() != crate::COMPONENT {
            return Err(ConfigProblem::new(
                "",
                format!(
                    "plugin `example-delta` has no bridge `{}`",
                    config.component
                ),
            )
            .with_help("its one bridge: delta"));
        }
        let raw: Raw = sdk::parse_options(config.options_json.as_str())?;
        let mb = raw.bucket_mb;
        if !(mb.is_finite() && (0.001..=65536.0).contains(&mb)) {
            return Err(ConfigProblem::new(
                "bucket_mb",
                format!("must be between 0.001 and 65536 MiB, not {mb}"),
            )
            .with_help("the bucket size in MiB, e.g. bucket_mb = 64"));
        }
        Ok(Options {
            bucket_bytes: (mb * 1048576.0) as u64,
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
        Options::parse(&config("delta", options_json))
    }

    #[test]
    fn bucket_mb_defaults_to_64_mib_and_takes_fractions() {
        assert_eq!(parse("").unwrap().bucket_bytes, 64 << 20);
        assert_eq!(parse("{}").unwrap().bucket_bytes, 64 << 20);
        assert_eq!(parse(r#"{"bucket_mb": 2}"#).unwrap().bucket_bytes, 2 << 20);
        assert_eq!(
            parse(r#"{"bucket_mb": 0.5}"#).unwrap().bucket_bytes,
            512 << 10
        );
    }

    #[test]
    fn a_bucket_mb_of_the_wrong_type_is_refused_at_its_key() {
        let p = parse(r#"{"bucket_mb": "x"}"#).unwrap_err();
        assert_eq!(p.key.as_str(), "bucket_mb");
        assert!(p.message.contains("invalid type"), "{p}");
    }

    #[test]
    fn a_bucket_mb_out_of_range_is_refused_with_the_value() {
        for bad in ["0", "-1", "0.0001", "100000"] {
            let p = parse(&format!(r#"{{"bucket_mb": {bad}}}"#)).unwrap_err();
            assert_eq!(p.key.as_str(), "bucket_mb", "{bad}");
            assert!(p.message.contains("between 0.001 and 65536"), "{bad}: {p}");
        }
    }

    #[test]
    fn an_unknown_option_is_refused_by_name() {
        let p = parse(r#"{"bucket_mb": 8, "compress": true}"#).unwrap_err();
        assert_eq!(p.key.as_str(), "compress");
        assert!(p.message.contains("unknown field"), "{p}");
    }

    #[test]
    fn another_component_name_is_refused() {
        let p = Options::parse(&config("broadcast", "")).unwrap_err();
        assert!(p.message.contains("no bridge `broadcast`"), "{p}");
    }
}
