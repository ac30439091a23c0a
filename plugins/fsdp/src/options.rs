//! `[trainer] options` of the `fsdp` trainer (JSON from the job file), and where the Python
//! interpreter comes from (`tandem_plugin_support::python`).

use std::path::PathBuf;

use serde::Deserialize;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError};
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

impl FsdpOptions {
    /// Parses the job file's options table (JSON) and checks the values.
    pub fn parse(json: &str) -> Result<FsdpOptions> {
        let json = if json.trim().is_empty() { "{}" } else { json };
        let o: FsdpOptions = serde_json::from_str(json).map_err(|e| {
            PluginError::invalid_input(format!("trainer `fsdp` options: {e}"))
                .with_help("see `tandem plugins` and plugins/fsdp/NOTES.md for the keys")
        })?;
        if o.ranks == 0 || o.ranks > 64 {
            return Err(PluginError::invalid_input(format!(
                "trainer `fsdp` options: ranks = {} (must be 1..=64)",
                o.ranks
            )));
        }
        if !matches!(o.dtype.as_str(), "float32" | "bfloat16" | "float16") {
            return Err(PluginError::invalid_input(format!(
                "trainer `fsdp` options: dtype `{}` is not float32, bfloat16 or float16",
                o.dtype
            )));
        }
        for (k, v) in [
            ("startup_timeout_s", o.startup_timeout_s),
            ("call_timeout_s", o.call_timeout_s),
            ("collective_timeout_s", o.collective_timeout_s),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return Err(PluginError::invalid_input(format!(
                    "trainer `fsdp` options: {k} = {v} (must be > 0)"
                )));
            }
        }
        if let Some(l) = &o.lora
            && (l.rank == 0 || l.alpha <= 0.0)
        {
            return Err(PluginError::invalid_input(
                "trainer `fsdp` options: lora.rank and lora.alpha must be > 0",
            ));
        }
        Ok(o)
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
        assert!(e.message.contains("ranks = 0"), "{}", e.message);
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
}
