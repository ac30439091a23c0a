//! The `dataset` environment's `[environment.options]`.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use tandem_plugin_api::PluginError;
use tandem_plugin_api::sdk::{Result, parse_options};

fn yes() -> bool {
    true
}

/// The options (unknown keys refused, each error naming its key).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetOptions {
    /// The training data: a JSONL/JSON, Parquet or Arrow file, or a `save_to_disk`
    /// directory; relative to the job file's directory.
    pub path: String,
    /// A second file with the held-out split.
    #[serde(default)]
    pub held_out: Option<String>,
    /// Or: the fraction (0 < f < 1) of `path`'s rows held out, chosen from the seed.
    #[serde(default)]
    pub held_out_fraction: Option<f64>,
    /// The prompt column (default `prompt`, else `messages`): text, or a list of
    /// `{role, content}`.
    #[serde(default)]
    pub prompt: Option<String>,
    /// The answer column or dotted path (default: the first present of `answer`,
    /// `ground_truth`, `reward_model.ground_truth`).
    #[serde(default)]
    pub answer: Option<String>,
    /// The data-source column (default `data_source` when present).
    #[serde(default)]
    pub source: Option<String>,
    /// The id column (default: the row number within its file).
    #[serde(default)]
    pub id: Option<String>,
    /// Shuffle the training rows each epoch (from the seed and the epoch).
    #[serde(default = "yes")]
    pub shuffle: bool,
    /// The reward of every row (a reward spec, see `verify`).
    #[serde(default)]
    pub reward: Option<Value>,
    /// Reward specs by data source, overriding `reward` for rows of that source.
    #[serde(default)]
    pub sources: BTreeMap<String, Value>,
}

impl DatasetOptions {
    /// Parses the options JSON; errors name the key.
    pub fn parse(json: &str) -> Result<DatasetOptions> {
        let options: DatasetOptions = parse_options(json).map_err(|p| {
            let key = match p.key.as_str() {
                "" => "options".to_owned(),
                key => format!("options.{key}"),
            };
            PluginError::invalid_input(format!("{key}: {}", p.message)).with_help(p.help.as_str())
        })?;
        if let Some(f) = options.held_out_fraction {
            if !(f > 0.0 && f < 1.0) {
                return Err(crate::verify::option_error(
                    "held_out_fraction",
                    format!("{f} is not between 0 and 1"),
                    "write a fraction such as 0.1",
                ));
            }
            if options.held_out.is_some() {
                return Err(crate::verify::option_error(
                    "held_out_fraction",
                    "set together with held_out",
                    "keep one: a held-out file or a fraction",
                ));
            }
        }
        if options.reward.is_none() && options.sources.is_empty() {
            return Err(crate::verify::option_error(
                "reward",
                "no reward is set",
                "set e.g. reward = { verifier = \"math\" } (or per data source in `sources`)",
            ));
        }
        Ok(options)
    }
}
