//! `[trainer] options` of the `fsdp` trainer (JSON from the job file), and where the Python
//! interpreter comes from (`tandem_plugin_support::python`).

use std::path::PathBuf;

use serde::Deserialize;
use tandem_plugin_api::sdk::{self, Result};
use tandem_plugin_api::{ConfigProblem, ErrorCode, PluginError};
use tandem_plugin_support::Python;
use tandem_plugin_support::python::{PYTHON_ENV, resolve_python};

/// `options.lora`: train a PEFT LoRA adapter on a frozen base (same keys as the native
/// trainer's, so a job switches trainers by changing `plugin`).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoraOptions {
    /// Rank.
    pub rank: u32,
    /// Scaling numerator (`scale = alpha / rank`).
    pub alpha: f32,
    /// PEFT module names (default: all seven projections).
    #[serde(default)]
    pub targets: Vec<String>,
    /// Seed of A's initialisation (the same on every rank).
    #[serde(default)]
    pub seed: u64,
}

/// Options of the trainer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FsdpOptions {
    /// Python interpreter of the venv (default: `$TANDEM_PYTHON`, else the venv
    /// `scripts/setup-python.sh` recorded).
    pub python: Option<PathBuf>,
    /// FSDP ranks (torchrun `--nproc-per-node`).
    pub ranks: u32,
    /// Parameter dtype (`float32`, `bfloat16`).
    pub dtype: String,
    /// Torch threads per rank (default: cores ÷ ranks, at least 1).
    pub threads: Option<u32>,
    /// LoRA mode.
    pub lora: Option<LoraOptions>,
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
}

impl Default for FsdpOptions {
    fn default() -> Self {
        FsdpOptions {
            python: None,
            ranks: 1,
            dtype: "float32".into(),
            threads: None,
            lora: None,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            startup_timeout_s: 300.0,
            call_timeout_s: 1800.0,
            collective_timeout_s: 600.0,
        }
    }
}

/// What the trainer's errors about its options start with.
const WHAT: &str = "trainer `fsdp`";

impl FsdpOptions {
    /// Parses the job file's options table (JSON) and checks the values: the constructor's
    /// side of [`FsdpOptions::problems_of`] (same parse, same checks).
    pub fn parse(json: &str) -> Result<FsdpOptions> {
        let o: FsdpOptions = sdk::parse_options(json).map_err(|p| {
            p.to_error(WHAT)
                .with_help("see `tandem plugins` and plugins/fsdp/NOTES.md for the keys")
        })?;
        match o.problems().first() {
            Some(p) => Err(p.to_error(WHAT)),
            None => Ok(o),
        }
    }

    /// Every problem of the options JSON (`validate_config`): the parse error, or the static
    /// checks'. Looks for no interpreter and starts nothing.
    pub fn problems_of(json: &str) -> Vec<ConfigProblem> {
        match sdk::parse_options::<FsdpOptions>(json) {
            Ok(o) => o.problems(),
            Err(p) => {
                vec![p.with_help("see `tandem plugins` and plugins/fsdp/NOTES.md for the keys")]
            }
        }
    }

    /// Static checks: ranks, dtype, timeouts, optimizer and LoRA values.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if self.ranks == 0 || self.ranks > 64 {
            p.push(
                ConfigProblem::new("ranks", format!("must be in 1..=64, got {}", self.ranks))
                    .with_help("the number of FSDP ranks torchrun starts, e.g. ranks = 2"),
            );
        }
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
        if let Some(l) = &self.lora {
            if l.rank == 0 {
                p.push(ConfigProblem::new("lora.rank", "must be at least 1"));
            }
            if !(l.alpha > 0.0 && l.alpha.is_finite()) {
                p.push(ConfigProblem::new(
                    "lora.alpha",
                    format!("must be > 0, got {}", l.alpha),
                ));
            }
        }
        p
    }

    /// The interpreter: `python`, else `$TANDEM_PYTHON`, else the venv
    /// `scripts/setup-python.sh` recorded, else an error saying how to get one.
    pub fn interpreter(&self) -> Result<Python> {
        resolve_python(self.python.as_deref()).map_err(|e| {
            PluginError::new(ErrorCode::NotAvailable, format!("trainer `fsdp`: {e}")).with_help(
                format!(
                    "{} (torch, transformers, peft from python/requirements-cpu.lock); or set \
                     ${PYTHON_ENV} or options.python",
                    e.help()
                ),
            )
        })
    }

    /// Torch threads per rank.
    pub fn threads_per_rank(&self) -> u32 {
        self.threads.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
            (cores / self.ranks).max(1)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let o = FsdpOptions::parse("").unwrap();
        assert_eq!(o.ranks, 1);
        let o = FsdpOptions::parse(r#"{"ranks": 2, "lora": {"rank": 4, "alpha": 8}}"#).unwrap();
        assert_eq!(o.ranks, 2);
        assert_eq!(o.lora.unwrap().rank, 4);
        let e = FsdpOptions::parse(r#"{"rank": 2}"#).unwrap_err();
        assert!(e.message.contains("unknown field `rank`"), "{}", e.message);
        let e = FsdpOptions::parse(r#"{"ranks": 0}"#).unwrap_err();
        assert_eq!(
            e.message.as_str(),
            "trainer `fsdp` options: ranks: must be in 1..=64, got 0"
        );
        let e = FsdpOptions::parse(r#"{"dtype": "int8"}"#).unwrap_err();
        assert!(e.message.contains("int8"), "{}", e.message);
    }

    #[test]
    fn the_python_option_is_the_interpreter() {
        let o = FsdpOptions::parse(r#"{"python": "/venv/bin/python"}"#).unwrap();
        let p = o.interpreter().unwrap();
        assert_eq!(p.path, std::path::Path::new("/venv/bin/python"));
        assert_eq!(p.source, tandem_plugin_support::PythonSource::Option);
    }

    #[test]
    fn validation_reports_every_problem_at_its_key() {
        assert!(FsdpOptions::problems_of("").is_empty());
        let p = FsdpOptions::problems_of(r#"{"rank": 2}"#);
        assert_eq!(p[0].key.as_str(), "rank");
        let p = FsdpOptions::problems_of(
            r#"{"ranks": 0, "call_timeout_s": -1, "lora": {"rank": 0, "alpha": 8}}"#,
        );
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["ranks", "call_timeout_s", "lora.rank"]);
    }
}
