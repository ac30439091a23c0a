//! The options every torchrun trainer takes ([`Common`]: interpreter, dtype, threads, AdamW,
//! timeouts, export digests) beside the plugin's own, parsed from one `[trainer.options]` table by
//! [`parse`], and the interpreter lookup with its job-file check.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tandem_plugin_api::sdk::{self, Result};
use tandem_plugin_api::{ConfigProblem, ErrorCode, PluginError};

use crate::Python;
use crate::python::{PYTHON_ENV, SETUP_HELP, resolve_python};

/// Keys of [`Common`], as the job file spells them.
pub const COMMON_KEYS: [&str; 11] = [
    "python",
    "dtype",
    "threads",
    "weight_decay",
    "beta1",
    "beta2",
    "eps",
    "startup_timeout_s",
    "call_timeout_s",
    "collective_timeout_s",
    "digest",
];

/// Options shared by the torchrun trainers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Common {
    /// Python interpreter of the venv (default: `$TANDEM_PYTHON`, else the venv
    /// `scripts/setup-python.sh` recorded).
    pub python: Option<PathBuf>,
    /// Parameter dtype (`float32`, `bfloat16`, `float16`).
    pub dtype: String,
    /// Torch threads per rank (default: cores ÷ ranks, at least 1).
    pub threads: Option<u32>,
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// AdamW β1.
    pub beta1: f32,
    /// AdamW β2.
    pub beta2: f32,
    /// AdamW ε.
    pub eps: f32,
    /// Seconds from launch until rank 0 connects.
    pub startup_timeout_s: f64,
    /// Seconds one operation may take.
    pub call_timeout_s: f64,
    /// Seconds a collective may wait for a peer rank (gloo / NCCL timeout).
    pub collective_timeout_s: f64,
    /// Compute the `st256` weights digest of every export from the tensors as they are
    /// written (default). `false` exports an empty digest (no engine check possible).
    pub digest: bool,
}

impl Default for Common {
    fn default() -> Self {
        Common {
            python: None,
            dtype: "float32".into(),
            threads: None,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            startup_timeout_s: 300.0,
            call_timeout_s: 1800.0,
            collective_timeout_s: 600.0,
            digest: true,
        }
    }
}

/// Splits the options table into the plugin's keys (`own`) and [`Common`]'s and parses each
/// part; an unknown key is named with both key sets.
pub fn parse<M: DeserializeOwned>(
    json: &str,
    own: &[&str],
) -> std::result::Result<(Common, M), ConfigProblem> {
    let table: Map<String, Value> = sdk::parse_options(json)?;
    let (mine, rest): (Map<String, Value>, Map<String, Value>) = table
        .into_iter()
        .partition(|(k, _)| own.contains(&k.as_str()));
    let plugin: M = sdk::parse_options(&Value::Object(mine).to_string())?;
    let common: Common = sdk::parse_options(&Value::Object(rest).to_string()).map_err(|p| {
        if p.message.starts_with("unknown field") {
            let mut keys: Vec<&str> = own.iter().copied().chain(COMMON_KEYS).collect();
            keys.sort_unstable();
            let expected: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
            ConfigProblem::new(
                p.key.as_str(),
                format!(
                    "unknown field `{}`, expected one of {}",
                    p.key,
                    expected.join(", ")
                ),
            )
            .with_help(p.help.as_str())
        } else {
            p
        }
    })?;
    Ok((common, plugin))
}

impl Common {
    /// Static checks: dtype, threads, timeouts, AdamW values.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if !matches!(self.dtype.as_str(), "float32" | "bfloat16" | "float16") {
            p.push(ConfigProblem::new(
                "dtype",
                format!("`{}` is not float32, bfloat16 or float16", self.dtype),
            ));
        }
        if self.threads == Some(0) {
            p.push(
                ConfigProblem::new("threads", "must be at least 1")
                    .with_help("remove it for cores / ranks"),
            );
        }
        for (k, v) in [
            ("startup_timeout_s", self.startup_timeout_s),
            ("call_timeout_s", self.call_timeout_s),
            ("collective_timeout_s", self.collective_timeout_s),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                p.push(ConfigProblem::new(
                    k,
                    format!("must be > 0 (seconds), got {v}"),
                ));
            }
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            p.push(ConfigProblem::new(
                "weight_decay",
                format!("must be >= 0, got {}", self.weight_decay),
            ));
        }
        for (k, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                p.push(ConfigProblem::new(
                    k,
                    format!("must be in [0, 1), got {beta}"),
                ));
            }
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            p.push(ConfigProblem::new(
                "eps",
                format!("must be > 0, got {}", self.eps),
            ));
        }
        p
    }

    /// Torch threads per rank: `threads`, else cores ÷ `ranks` (at least 1).
    pub fn threads_per_rank(&self, ranks: u32) -> u32 {
        self.threads.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
            (cores / ranks.max(1)).max(1)
        })
    }

    /// The AdamW settings and dtype as the worker reads them (`cfg["options"]`).
    pub fn worker_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("dtype".into(), self.dtype.clone().into());
        m.insert("weight_decay".into(), f64::from(self.weight_decay).into());
        m.insert("beta1".into(), f64::from(self.beta1).into());
        m.insert("beta2".into(), f64::from(self.beta2).into());
        m.insert("eps".into(), f64::from(self.eps).into());
        m.insert("digest".into(), self.digest.into());
        m
    }

    /// The interpreter: `python`, else `$TANDEM_PYTHON`, else the venv
    /// `scripts/setup-python.sh` recorded, else an error saying how to get one.
    pub fn interpreter(&self, what: &str) -> Result<Python> {
        interpreter(what, self.python.as_deref())
    }

    /// The interpreter problem `validate_config` reports (what `init` would fail on), if any:
    /// none found, or a path that does not exist. A bare name is looked up on PATH at spawn.
    pub fn python_problems(&self, what: &str) -> Vec<ConfigProblem> {
        match self.interpreter(what) {
            Err(e) => {
                let message = e.message.as_str();
                let prefix = format!("{what}: ");
                let message = message.strip_prefix(&prefix).unwrap_or(message);
                vec![ConfigProblem::new("python", message).with_help(e.help)]
            }
            Ok(python) if python.path.components().count() > 1 && !python.path.is_file() => {
                vec![
                    ConfigProblem::new(
                        "python",
                        format!(
                            "Python {} (from {}) does not exist",
                            python.path.display(),
                            python.source
                        ),
                    )
                    .with_help(SETUP_HELP),
                ]
            }
            Ok(_) => Vec::new(),
        }
    }
}

/// The interpreter for `what` (``trainer `fsdp` ``): `option`, else `$TANDEM_PYTHON`, else
/// the recorded venv, else a `NotAvailable` error with how to create it.
pub fn interpreter(what: &str, option: Option<&Path>) -> Result<Python> {
    resolve_python(option).map_err(|e| {
        PluginError::new(ErrorCode::NotAvailable, format!("{what}: {e}")).with_help(format!(
            "{} (python/requirements-cpu.lock); or set ${PYTHON_ENV} or options.python",
            e.help()
        ))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Own {
        ranks: u32,
    }

    #[test]
    fn one_table_feeds_both_parts_and_an_unknown_key_names_both_key_sets() {
        let (c, o): (Common, Own) = parse(r#"{"ranks": 2, "beta1": 0.5}"#, &["ranks"]).unwrap();
        assert_eq!((o.ranks, c.beta1), (2, 0.5));
        let (c, o): (Common, Own) = parse("", &["ranks"]).unwrap();
        assert_eq!((o.ranks, c.dtype.as_str(), c.digest), (0, "float32", true));
        assert_eq!(c.worker_json()["digest"], true);
        let (c, _): (Common, Own) = parse(r#"{"digest": false}"#, &["ranks"]).unwrap();
        assert_eq!(c.worker_json()["digest"], false);
        let p = parse::<Own>(r#"{"rank": 2}"#, &["ranks"]).unwrap_err();
        assert_eq!(p.key.as_str(), "rank");
        assert!(
            p.message.contains("`ranks`") && p.message.contains("`beta1`"),
            "{}",
            p.message
        );
        let p = parse::<Own>(r#"{"ranks": "two"}"#, &["ranks"]).unwrap_err();
        assert_eq!(p.key.as_str(), "ranks");
    }

    #[test]
    fn checks_report_each_bad_value_at_its_key() {
        let (c, _): (Common, Own) = parse(
            r#"{"dtype": "int8", "threads": 0, "call_timeout_s": -1, "beta2": 1.0, "eps": 0}"#,
            &["ranks"],
        )
        .unwrap();
        let keys: Vec<String> = c.problems().iter().map(|p| p.key.to_string()).collect();
        assert_eq!(keys, ["dtype", "threads", "call_timeout_s", "beta2", "eps"]);
        assert_eq!(c.threads_per_rank(1000).max(1), 1);
    }

    #[test]
    fn the_python_option_is_the_interpreter() {
        let (c, _): (Common, Own) = parse(r#"{"python": "/venv/bin/python"}"#, &[]).unwrap();
        let p = c.interpreter("trainer `x`").unwrap();
        assert_eq!(p.path, Path::new("/venv/bin/python"));
        assert_eq!(p.source, crate::PythonSource::Option);
        let probs = c.python_problems("trainer `x`");
        assert_eq!(probs[0].key.as_str(), "python");
        assert!(
            probs[0].message.contains("does not exist"),
            "{}",
            probs[0].message
        );
    }
}
