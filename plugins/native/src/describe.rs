//! `describe_config` of the `native` plugin: what each component does with the options a job
//! gives it (the same parse as the constructors; the model's `config.json` read for its
//! position table, nothing else opened).

use tandem_native_core::init::Preset;
use tandem_plugin_api::{ComponentConfig, ComponentKind, ConfigCaps, RString, UpdateKind, sdk};

use super::engine::EngineOptions;
use super::trainer::TrainerOptions;

/// The capabilities of the `native` component `kind` with the options in `config`; `None`
/// when they do not parse (`validate_config` reports why).
pub fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
    let presets = || -> Vec<RString> { Preset::ALL.iter().map(|p| p.name().into()).collect() };
    match kind {
        ComponentKind::Trainer if config.component.as_str() == crate::drafter::COMPONENT => {
            Some(ConfigCaps {
                update_kinds: vec![UpdateKind::CheckpointDir].into(),
                ..ConfigCaps::default()
            })
        }
        ComponentKind::Trainer => {
            let opts = sdk::parse_options::<TrainerOptions>(&config.options_json).ok()?;
            // LoRA exports the adapter only; a full fine-tune every weight, never an adapter.
            let kinds = if opts.lora.is_some() {
                vec![UpdateKind::Adapter]
            } else {
                vec![UpdateKind::SharedRegion, UpdateKind::CheckpointDir]
            };
            Some(ConfigCaps {
                update_kinds: kinds.into(),
                presets: presets().into(),
                reports_digest: opts.digest,
                // `train_step_policy`: every variant of `tandem_native_core::loss`.
                loss_variants: true,
                // `train_step_advantages` (every variant) and the value model (`compute_values`,
                // `train_step_value`: a value head over the body), with LoRA too: a LoRA critic
                // trains its adapter and the head on the frozen base, the same code path (the
                // body's backward feeds whichever gradients are trained) at an adapter's memory.
                token_advantages: true,
                value_model: true,
                ..ConfigCaps::default()
            })
        }
        ComponentKind::Engine => {
            let opts = sdk::parse_options::<EngineOptions>(&config.options_json).ok()?;
            let positions = model_positions(config.model_path.as_str());
            let max_seq = positions.map_or(opts.max_seq_len, |p| opts.max_seq_len.min(p));
            Some(ConfigCaps {
                update_kinds: crate::ENGINE_UPDATE_KINDS.to_vec().into(),
                draft_tokens: opts.draft_tokens as u32,
                speculate_below_batch: opts.speculate_below_batch.unwrap_or(0) as u32,
                max_seq_len: max_seq as u32,
                // The engine checks every update's digest against the weights it serves.
                reports_digest: true,
                serves: true,
                ..ConfigCaps::default()
            })
        }
        ComponentKind::Bridge => None,
    }
}

/// The model's position table (`max_position_embeddings` of its `config.json`), when the
/// directory holds one.
fn model_positions(model: &str) -> Option<usize> {
    let text = std::fs::read_to_string(std::path::Path::new(model).join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    config["max_position_embeddings"]
        .as_u64()
        .map(|n| n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(component: &str, options: &str) -> ComponentConfig {
        ComponentConfig {
            component: component.into(),
            model_path: "".into(),
            options_json: options.into(),
            rank: 0,
            world_size: 1,
            device: "cpu".into(),
            run_dir: "".into(),
        }
    }

    #[test]
    fn a_lora_trainer_exports_adapters_only_and_a_full_one_never() {
        let lora = describe_config(
            ComponentKind::Trainer,
            &config("native", r#"{"lora": {"rank": 8, "alpha": 16}}"#),
        )
        .expect("parses");
        assert_eq!(lora.update_kinds.as_slice(), &[UpdateKind::Adapter]);
        let full =
            describe_config(ComponentKind::Trainer, &config("native", "{}")).expect("parses");
        assert!(!full.update_kinds.contains(&UpdateKind::Adapter));
        assert!(full.update_kinds.contains(&UpdateKind::SharedRegion));
        assert!(full.reports_digest);
        assert!(lora.loss_variants && full.loss_variants);
        assert!(lora.value_model && full.value_model);
        assert!(lora.token_advantages && full.token_advantages);
        let quiet = describe_config(
            ComponentKind::Trainer,
            &config("native", r#"{"digest": false}"#),
        )
        .expect("parses");
        assert!(!quiet.reports_digest);
        assert!(
            describe_config(ComponentKind::Trainer, &config("native", r#"{"lr": 1}"#)).is_none()
        );
    }

    #[test]
    fn an_engine_says_its_draft_tokens_and_longest_sequence() {
        let e = describe_config(
            ComponentKind::Engine,
            &config("native", r#"{"max_seq_len": 96, "draft_tokens": 3}"#),
        )
        .expect("parses");
        assert_eq!((e.max_seq_len, e.draft_tokens), (96, 3));
        assert!(e.serves && e.reports_digest);
    }
}
