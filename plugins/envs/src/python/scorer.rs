//! A Python reward as a reward spec of the `dataset` environment ([`crate::verify`]):
//! `{ python = "module:function" }`, with the pool's options beside it (`workers`,
//! `timeout_s`, `start_timeout_s`, `memory_mb`, `cpu_s`, `python_path`, `reward_range`, and
//! `interpreter` for the pool's `python` option, since `python` names the function here).
//!
//! The function sees the item and the completion as in [`super::reward`], with the row the
//! item came from (every column, as read) as its metadata: TRL's keyword arguments are the
//! row's columns, verl's `extra_info` the row's `extra_info` column (else the row).

use super::{POOL_KEYS, PoolOptions, PythonReward, sample_json};
use crate::verify::{ScoreInput, Scorer, option_error};
use serde_json::{Map, Value};
use std::path::Path;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{EnvironmentConfig, Reward};

/// The key that makes a reward spec a Python reward.
pub const KEY: &str = "python";

const HELP: &str = "a Python reward is { python = \"module:function\" } with optional workers, \
                    timeout_s, start_timeout_s, memory_mb, cpu_s, python_path, reward_range \
                    and interpreter";

/// A Python reward function in its own pool.
struct PythonScorer {
    reward: PythonReward,
}

/// The scorer of `spec` at `key` when it is a Python reward (it has a `python` key), else
/// `None` (a built-in spec). The pool starts now, unless `config` is only checked.
pub fn build(
    spec: &Value,
    key: &str,
    config: &EnvironmentConfig,
) -> Result<Option<Box<dyn Scorer>>> {
    let Some(map) = spec.as_object().filter(|m| m.contains_key(KEY)) else {
        return Ok(None);
    };
    let mut map: Map<String, Value> = map.clone();
    let function = match map.remove(KEY) {
        Some(Value::String(f)) => f,
        other => {
            let shown = other.unwrap_or(Value::Null);
            return Err(option_error(
                &format!("{key}.{KEY}"),
                format!("{shown} is not a string"),
                HELP,
            ));
        }
    };
    if let Some(interpreter) = map.remove("interpreter") {
        map.insert("python".into(), interpreter);
    }
    if let Some(k) = map.keys().find(|k| !POOL_KEYS.contains(&k.as_str())) {
        return Err(option_error(
            &format!("{key}.{k}"),
            "unknown key beside `python`",
            HELP,
        ));
    }
    let options: PoolOptions =
        serde_json::from_value(Value::Object(map)).map_err(|e| option_error(key, e, HELP))?;
    let reward = PythonReward::new(
        &function,
        &options,
        Path::new(config.base_dir.as_str()),
        config.run_dir.as_str(),
    )?;
    Ok(Some(Box::new(PythonScorer { reward })))
}

impl Scorer for PythonScorer {
    fn components(&self) -> Vec<String> {
        Vec::new()
    }

    fn range(&self) -> (f64, f64) {
        self.reward.range()
    }

    /// The function decides what it compares with (a TRL reward may need no answer).
    fn needs_answer(&self) -> bool {
        false
    }

    fn score(&self, inputs: &[ScoreInput<'_>]) -> Vec<Reward> {
        let json: Vec<Value> = inputs
            .iter()
            .map(|i| {
                let mut s = sample_json(i.sample);
                if let Some(row @ Value::Object(_)) = i.row {
                    s["item"]["metadata"] = row.clone();
                }
                s
            })
            .collect();
        self.reward.score_json(&json)
    }
}
