//! `[trainer] options` of the `fsdp` trainer (JSON from the job file): its own keys (`ranks`,
//! `lora`) beside the ones every torchrun trainer takes
//! ([`tandem_plugin_support::torchrun::options::Common`]).

use serde::Deserialize;
use tandem_plugin_api::ConfigProblem;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_support::torchrun::options::{self, Common};

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

/// The keys only the `fsdp` trainer takes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Own {
    /// FSDP ranks (torchrun `--nproc-per-node`).
    pub ranks: u32,
    /// LoRA mode.
    pub lora: Option<LoraOptions>,
}

impl Default for Own {
    fn default() -> Self {
        Own {
            ranks: 1,
            lora: None,
        }
    }
}

const OWN_KEYS: [&str; 2] = ["ranks", "lora"];
/// What the trainer's errors about its options start with.
pub const WHAT: &str = "trainer `fsdp`";
const KEYS_HELP: &str = "see `tandem plugins` and plugins/fsdp/NOTES.md for the keys";

/// Options of the trainer.
#[derive(Debug, Clone)]
pub struct FsdpOptions {
    /// The `fsdp` keys.
    pub own: Own,
    /// The keys of every torchrun trainer.
    pub common: Common,
}

impl FsdpOptions {
    /// Parses the job file's options table (JSON) and checks the values: the constructor's
    /// side of [`FsdpOptions::problems_of`] (same parse, same checks).
    pub fn parse(json: &str) -> Result<FsdpOptions> {
        let (common, own) =
            options::parse(json, &OWN_KEYS).map_err(|p| p.to_error(WHAT).with_help(KEYS_HELP))?;
        let o = FsdpOptions { own, common };
        match o.problems().first() {
            Some(p) => Err(p.to_error(WHAT)),
            None => Ok(o),
        }
    }

    /// Every problem of the options JSON (`validate_config`): the parse error, or the static
    /// checks'. Looks for no interpreter and starts nothing.
    pub fn problems_of(json: &str) -> Vec<ConfigProblem> {
        match options::parse(json, &OWN_KEYS) {
            Ok((common, own)) => FsdpOptions { own, common }.problems(),
            Err(p) => vec![p.with_help(KEYS_HELP)],
        }
    }

    /// Static checks: ranks, LoRA values, then the common ones.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if self.own.ranks == 0 || self.own.ranks > 64 {
            p.push(
                ConfigProblem::new(
                    "ranks",
                    format!("must be in 1..=64, got {}", self.own.ranks),
                )
                .with_help("the number of FSDP ranks torchrun starts, e.g. ranks = 2"),
            );
        }
        p.extend(self.common.problems());
        if let Some(l) = &self.own.lora {
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
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let o = FsdpOptions::parse("").unwrap();
        assert_eq!(o.own.ranks, 1);
        let o = FsdpOptions::parse(r#"{"ranks": 2, "lora": {"rank": 4, "alpha": 8}}"#).unwrap();
        assert_eq!(o.own.ranks, 2);
        assert_eq!(o.own.lora.unwrap().rank, 4);
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
