//! `validate_config` of the `native` plugin: the constructors' own options parse
//! ([`parse_options`](super::common::parse_options) runs the same [`CheckOptions`]) plus the
//! static checks below, which need no model, memory or process.

use tandem_native_core::lora::{ALL_TARGETS, Target};
use tandem_plugin_api::sdk;
use tandem_plugin_api::{ComponentConfig, ComponentKind, ConfigProblem};

use super::common::CheckOptions;
use super::engine::EngineOptions;
use super::trainer::{LoraOptions, TrainerOptions, create};

/// Every problem of the options of the `native` component `kind`.
pub fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
    if kind == ComponentKind::Trainer && config.component.as_str() == crate::drafter::COMPONENT {
        return crate::drafter::validate_config(config);
    }
    match kind {
        ComponentKind::Engine => match sdk::parse_options::<EngineOptions>(&config.options_json) {
            Err(p) => vec![p],
            Ok(opts) => {
                let mut p = opts.problems();
                if p.is_empty()
                    && let Some(d) = &opts.drafter
                {
                    p.extend(crate::drafter::drafter_dir_problem(
                        "drafter",
                        d,
                        config.model_path.as_str(),
                    ));
                }
                p
            }
        },
        ComponentKind::Trainer => {
            match sdk::parse_options::<TrainerOptions>(&config.options_json) {
                Err(p) => vec![p],
                Ok(opts) => {
                    let mut p = opts.problems();
                    if p.is_empty() {
                        p.extend(create::dir_problem(&opts, config.model_path.as_str()));
                    }
                    p
                }
            }
        }
        ComponentKind::Bridge => vec![ConfigProblem::new(
            "",
            "plugin `native` provides no bridge component",
        )],
    }
}

impl CheckOptions for EngineOptions {
    fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if self.max_batch == 0 {
            p.push(
                ConfigProblem::new("max_batch", "must be at least 1 (KV cache slots)")
                    .with_help("e.g. max_batch = 8; sequences beyond it wait for a free slot"),
            );
        }
        if self.draft_tokens == 0 {
            p.push(
                ConfigProblem::new("draft_tokens", "must be at least 1")
                    .with_help("the drafter proposes this many tokens per round; e.g. 4"),
            );
        }
        if self.speculate_below_batch == Some(0) {
            p.push(
                ConfigProblem::new("speculate_below_batch", "must be at least 1").with_help(
                    "the engine speculates while at most this many sequences decode, e.g. 4; \
                         leave it out to speculate always, or the drafter out to never",
                ),
            );
        }
        if self.max_seq_len < 2 {
            p.push(
                ConfigProblem::new(
                    "max_seq_len",
                    format!(
                        "must be at least 2 (a prompt token and a generated one), got {}",
                        self.max_seq_len
                    ),
                )
                .with_help("set it to the longest prompt + max_tokens, e.g. 64"),
            );
        }
        p
    }
}

impl CheckOptions for TrainerOptions {
    fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            p.push(ConfigProblem::new(
                "weight_decay",
                format!("must be >= 0, got {}", self.weight_decay),
            ));
        }
        for (key, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                p.push(
                    ConfigProblem::new(key, format!("must be in [0, 1), got {beta}"))
                        .with_help("AdamW's moment decay rates; the defaults are 0.9 and 0.999"),
                );
            }
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            p.push(ConfigProblem::new(
                "eps",
                format!("must be > 0, got {}", self.eps),
            ));
        }
        if let Some(lora) = &self.lora {
            p.extend(lora_problems(lora));
        }
        for (key, v) in [
            ("micro_batch_tokens", self.micro_batch_tokens),
            ("micro_batch_sequences", self.micro_batch_sequences),
            ("head_chunk_mib", Some(self.head_chunk_mib)),
        ] {
            if v == Some(0) {
                p.push(
                    ConfigProblem::new(key, "must be at least 1")
                        .with_help("leave micro_batch_* out to train the whole batch in one pass"),
                );
            }
        }
        p.extend(create::preset_of(self).err());
        p
    }
}

fn lora_problems(o: &LoraOptions) -> Vec<ConfigProblem> {
    let mut p = Vec::new();
    if o.rank == 0 {
        p.push(ConfigProblem::new("lora.rank", "must be at least 1").with_help("e.g. rank = 8"));
    }
    if !(o.alpha > 0.0 && o.alpha.is_finite()) {
        p.push(
            ConfigProblem::new("lora.alpha", format!("must be > 0, got {}", o.alpha))
                .with_help("the adapter's scale is alpha / rank, e.g. alpha = 16 with rank = 8"),
        );
    }
    for (i, name) in o.targets.iter().enumerate() {
        if Target::from_module(name).is_none() {
            let known: Vec<&str> = ALL_TARGETS.iter().map(|t| t.module()).collect();
            p.push(
                ConfigProblem::new(
                    format!("lora.targets[{i}]"),
                    format!("`{name}` is not a projection of the model"),
                )
                .with_help(format!("use some of: {}", known.join(", "))),
            );
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(options: &str) -> ComponentConfig {
        ComponentConfig {
            component: "native".into(),
            model_path: "/nonexistent".into(),
            options_json: options.into(),
            rank: 0,
            world_size: 1,
            device: "cpu".into(),
            run_dir: "".into(),
        }
    }

    fn keys(kind: ComponentKind, options: &str) -> Vec<String> {
        validate_config(kind, &config(options))
            .iter()
            .map(|p| p.key.to_string())
            .collect()
    }

    #[test]
    fn engine_options_are_parsed_and_checked() {
        assert!(keys(ComponentKind::Engine, "").is_empty());
        assert!(
            keys(
                ComponentKind::Engine,
                r#"{"max_batch": 64, "max_seq_len": 64}"#
            )
            .is_empty()
        );
        assert_eq!(
            keys(ComponentKind::Engine, r#"{"max_bach": 4}"#),
            ["max_bach"]
        );
        assert_eq!(
            keys(ComponentKind::Engine, r#"{"max_batch": "4"}"#),
            ["max_batch"]
        );
        assert_eq!(
            keys(
                ComponentKind::Engine,
                r#"{"max_batch": 0, "max_seq_len": 1}"#
            ),
            ["max_batch", "max_seq_len"]
        );
    }

    #[test]
    fn trainer_options_are_parsed_and_checked() {
        assert!(
            keys(
                ComponentKind::Trainer,
                r#"{"lora": {"rank": 8, "alpha": 16}}"#
            )
            .is_empty()
        );
        assert_eq!(
            keys(ComponentKind::Trainer, r#"{"beta1": 1.0, "eps": 0}"#),
            ["beta1", "eps"]
        );
        assert_eq!(
            keys(
                ComponentKind::Trainer,
                r#"{"lora": {"rank": 0, "alpha": 16, "targets": ["q_proj", "qkv"]}}"#
            ),
            ["lora.rank", "lora.targets[1]"]
        );
        assert_eq!(
            keys(ComponentKind::Trainer, r#"{"lora": {"alpha": 16}}"#),
            ["lora.rank"]
        );
        assert!(
            keys(
                ComponentKind::Trainer,
                r#"{"init_preset": "big", "init_seed": 7}"#
            )
            .is_empty()
        );
        assert_eq!(
            keys(ComponentKind::Trainer, r#"{"init_preset": "huge"}"#),
            ["init_preset"]
        );
        assert_eq!(
            keys(ComponentKind::Trainer, r#"{"init_seed": -1}"#),
            ["init_seed"]
        );
    }

    #[test]
    fn constructors_refuse_what_validation_reports() {
        let e = super::super::common::parse_options::<EngineOptions>(
            r#"{"max_batch": 0}"#,
            "engine `native`",
        )
        .err()
        .map(|e| e.message.to_string())
        .unwrap_or_default();
        assert_eq!(
            e,
            "engine `native` options: max_batch: must be at least 1 (KV cache slots)"
        );
    }
}
