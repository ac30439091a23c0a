//! `[trainer] options` of the `megatron` trainer (JSON from the job file): the parallel layout
//! (`tp`, `dp`), micro-batch size, sequence length and seed, beside the keys every torchrun
//! trainer takes ([`tandem_plugin_support::torchrun::options::Common`]).

use serde::Deserialize;
use serde_json::{Map, Value};
use tandem_plugin_api::ConfigProblem;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_support::torchrun::options::{self, Common};

/// The keys only the `megatron` trainer takes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Own {
    /// Tensor-parallel size: each layer's weights split over this many ranks.
    pub tp: u32,
    /// Data-parallel size: replicas of the TP group, each on a share of the batch.
    pub dp: u32,
    /// Sequences per data-parallel rank per forward (gradients accumulate over them).
    pub micro_batch_size: u32,
    /// Longest sequence (prompt + completion) in tokens; also RoPE's table length.
    pub seq_length: u32,
    /// Seed of Megatron's model-parallel RNG (no dropout runs; kept for reproducibility).
    pub seed: u64,
}

impl Default for Own {
    fn default() -> Self {
        Own {
            tp: 1,
            dp: 1,
            micro_batch_size: 8,
            seq_length: 1024,
            seed: 1234,
        }
    }
}

const OWN_KEYS: [&str; 5] = ["tp", "dp", "micro_batch_size", "seq_length", "seed"];
/// What the trainer's errors about its options start with.
pub const WHAT: &str = "trainer `megatron`";
const KEYS_HELP: &str = "see `tandem plugins` and plugins/megatron/NOTES.md for the keys";
/// Most ranks one job may start.
const MAX_RANKS: u32 = 64;

/// Options of the trainer.
#[derive(Debug, Clone)]
pub struct MegatronOptions {
    /// The `megatron` keys.
    pub own: Own,
    /// The keys of every torchrun trainer.
    pub common: Common,
}

impl MegatronOptions {
    /// Parses the job file's options table (JSON) and checks the values: the constructor's
    /// side of [`MegatronOptions::problems_of`] (same parse, same checks).
    pub fn parse(json: &str) -> Result<MegatronOptions> {
        let (common, own) =
            options::parse(json, &OWN_KEYS).map_err(|p| p.to_error(WHAT).with_help(KEYS_HELP))?;
        let o = MegatronOptions { own, common };
        match o.problems().first() {
            Some(p) => Err(p.to_error(WHAT)),
            None => Ok(o),
        }
    }

    /// Every problem of the options JSON (`validate_config`): the parse error, or the static
    /// checks'. Reads no model and starts nothing (heads ÷ `tp` is checked at `init`, where
    /// the model's config is read).
    pub fn problems_of(json: &str) -> Vec<ConfigProblem> {
        match options::parse(json, &OWN_KEYS) {
            Ok((common, own)) => MegatronOptions { own, common }.problems(),
            Err(p) => vec![p.with_help(KEYS_HELP)],
        }
    }

    /// Ranks of the job: `tp × dp`.
    pub fn ranks(&self) -> u32 {
        self.own.tp.saturating_mul(self.own.dp)
    }

    /// Static checks: the layout, batch and sequence sizes, then the common ones.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        for (k, v) in [("tp", self.own.tp), ("dp", self.own.dp)] {
            if v == 0 {
                p.push(ConfigProblem::new(k, "must be at least 1"));
            }
        }
        if self.ranks() > MAX_RANKS {
            p.push(
                ConfigProblem::new(
                    "tp",
                    format!(
                        "tp × dp = {} ranks exceeds {MAX_RANKS}",
                        u64::from(self.own.tp) * u64::from(self.own.dp)
                    ),
                )
                .with_help("torchrun starts tp × dp ranks on this host"),
            );
        }
        if self.own.micro_batch_size == 0 {
            p.push(ConfigProblem::new("micro_batch_size", "must be at least 1"));
        }
        if self.own.seq_length < 2 {
            p.push(ConfigProblem::new(
                "seq_length",
                format!("must be at least 2 tokens, got {}", self.own.seq_length),
            ));
        }
        p.extend(self.common.problems());
        if self.common.dtype == "float16" {
            p.push(
                ConfigProblem::new(
                    "dtype",
                    "float16 needs loss scaling, which the megatron trainer does not do",
                )
                .with_help("use float32 or bfloat16"),
            );
        }
        p
    }

    /// The worker's `cfg["options"]`.
    pub fn worker_json(&self) -> Value {
        let mut m: Map<String, Value> = self.common.worker_json();
        m.insert("tp".into(), self.own.tp.into());
        m.insert("dp".into(), self.own.dp.into());
        m.insert("micro_batch_size".into(), self.own.micro_batch_size.into());
        m.insert("seq_length".into(), self.own.seq_length.into());
        m.insert("seed".into(), self.own.seed.into());
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_layout_and_bad_values() {
        let o = MegatronOptions::parse("").unwrap();
        assert_eq!((o.own.tp, o.own.dp, o.ranks()), (1, 1, 1));
        let o = MegatronOptions::parse(r#"{"tp": 2, "dp": 2, "beta2": 0.98}"#).unwrap();
        assert_eq!(o.ranks(), 4);
        assert_eq!(o.worker_json()["tp"], 2);
        assert!((o.worker_json()["beta2"].as_f64().unwrap() - 0.98).abs() < 1e-6);
        let e = MegatronOptions::parse(r#"{"tp": 0}"#).unwrap_err();
        assert_eq!(
            e.message.as_str(),
            "trainer `megatron` options: tp: must be at least 1"
        );
        let e = MegatronOptions::parse(r#"{"pp": 2}"#).unwrap_err();
        assert!(e.message.contains("unknown field `pp`"), "{}", e.message);
        assert!(e.message.contains("`tp`"), "{}", e.message);
    }

    #[test]
    fn validation_reports_every_problem_at_its_key() {
        assert!(MegatronOptions::problems_of("").is_empty());
        let p = MegatronOptions::problems_of(
            r#"{"tp": 16, "dp": 8, "micro_batch_size": 0, "seq_length": 1, "eps": -1}"#,
        );
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["tp", "micro_batch_size", "seq_length", "eps"]);
    }
}
