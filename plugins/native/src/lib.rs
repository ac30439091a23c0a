//! The `native` plugin: the engine and trainer components over `tandem-native-core` (a
//! Llama-family CPU backend), their tensors in memory-layer regions through the host-region
//! [`BufferProvider`](tandem_native_core::buffer::BufferProvider).
//!
//! Built in through `register_builtin!` below (the host links this crate as an rlib); the
//! `tandem-plugin-native-cdylib` crate exports the same [`NativePlugin`] as a library.
//! See `plugins/native/PLUGIN-NOTES.md` for the codemap and invariants.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod batch;
pub mod common;
pub mod describe;
pub mod drafter;
pub mod engine;
pub mod provider;
pub mod trainer;
pub mod validate;

/// The plugin contract (`tandem-conformance`) on the native engine and trainer.
#[cfg(test)]
mod conformance_tests;
/// `init_preset` / `init_seed` through the root module.
#[cfg(test)]
mod init_preset_tests;
/// `train_step_policy` (the policy-loss variants) through the root module.
#[cfg(test)]
mod policy_loss_tests;
/// The value model and per-token advantages through the root module.
#[cfg(test)]
mod value_tests;

use tandem_plugin_api::sdk::{self, Plugin, Result, engine_box, trainer_box};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps, ConfigProblem,
    EngineBox, HostBox, PauseMode, PluginError, PluginManifest, RString, TrainerBox, UpdateKind,
};

pub use drafter::{DrafterOptions, NativeDrafterTrainer};
pub use engine::{EngineOptions, NativeEngine};
pub use trainer::{NativeTrainer, TrainerOptions};

/// The `native` plugin.
pub struct NativePlugin;

fn strs(v: &[&str]) -> tandem_plugin_api::RVec<RString> {
    v.iter().map(|s| RString::from(*s)).collect()
}

/// The update kinds the trainer exports.
const UPDATE_KINDS: [UpdateKind; 3] = [
    UpdateKind::SharedRegion,
    UpdateKind::CheckpointDir,
    UpdateKind::Adapter,
];

/// The update kinds the engine applies: the trainer's, and tensor buckets over a transport
/// group (the `broadcast` bridge).
const ENGINE_UPDATE_KINDS: [UpdateKind; 4] = [
    UpdateKind::SharedRegion,
    UpdateKind::CheckpointDir,
    UpdateKind::Adapter,
    UpdateKind::TensorBuckets,
];

impl Plugin for NativePlugin {
    fn manifest() -> PluginManifest {
        let engine = ComponentDecl {
            kind: ComponentKind::Engine,
            name: "native".into(),
            description: "Llama/Qwen2 CPU engine: batched KV-cache decode, LoRA, host regions"
                .into(),
            caps: Capabilities {
                update_kinds: ENGINE_UPDATE_KINDS.to_vec().into(),
                releasable_tags: strs(&engine::RELEASABLE),
                pause_modes: vec![PauseMode::Abort, PauseMode::Wait].into(),
                hidden_states: true,
                lora: true,
                needs_gpu: Default::default(),
                notes: strs(&[
                    "speculative decoding with an EAGLE-3 drafter (options drafter, draft_tokens)",
                    "hidden_states: any layers' input residual streams, inline or over a transport group",
                    "abort takes effect between batches of max_batch prompts",
                    "release/resume need host memory services (tandem worker)",
                    "shared_region maps the trainer's weights in place (weights not releasable then)",
                ]),
            },
        };
        let trainer = ComponentDecl {
            kind: ComponentKind::Trainer,
            name: "native".into(),
            description: "Llama/Qwen2 CPU trainer: SFT and GRPO, AdamW, full or LoRA".into(),
            caps: Capabilities {
                update_kinds: UPDATE_KINDS.to_vec().into(),
                releasable_tags: strs(&trainer::OFFLOADABLE),
                pause_modes: Default::default(),
                hidden_states: false,
                lora: true,
                needs_gpu: Default::default(),
                notes: strs(&[
                    "exports shared_region or checkpoint_dir in full fine-tuning, adapter in LoRA mode",
                    "shared_region needs host memory (tandem worker); weights then stay resident",
                ]),
            },
        };
        let drafter = ComponentDecl {
            kind: ComponentKind::Trainer,
            name: drafter::COMPONENT.into(),
            description: "EAGLE-3 drafter trainer for a fixed target: training-time test on the \
                          target's hidden states, AdamW"
                .into(),
            caps: Capabilities {
                update_kinds: vec![UpdateKind::CheckpointDir].into(),
                releasable_tags: strs(&drafter::OFFLOADABLE),
                pause_modes: Default::default(),
                hidden_states: true,
                lora: false,
                needs_gpu: Default::default(),
                notes: strs(&[
                    "trains with train_step_features: hidden states inline or over a transport group",
                    "exports the drafter as a directory (checkpoint_dir) engines load with load_drafter",
                ]),
            },
        };
        sdk::manifest(
            "native",
            env!("CARGO_PKG_VERSION"),
            vec![engine, trainer, drafter],
        )
    }

    fn new_engine(config: ComponentConfig, host: HostBox) -> Result<EngineBox> {
        check_component(&config)?;
        Ok(engine_box(NativeEngine::new(&config, host)?))
    }

    fn new_trainer(config: ComponentConfig, host: HostBox) -> Result<TrainerBox> {
        check_component(&config)?;
        if config.component.as_str() == drafter::COMPONENT {
            return Ok(trainer_box(NativeDrafterTrainer::new(config, host)?));
        }
        Ok(trainer_box(NativeTrainer::new(config, host)?))
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if let Err(e) = check_component(config) {
            return vec![ConfigProblem::new("", e.message.as_str())];
        }
        validate::validate_config(kind, config)
    }

    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        check_component(config).ok()?;
        describe::describe_config(kind, config)
    }
}

fn check_component(config: &ComponentConfig) -> Result<()> {
    if config.component.as_str() == "native" || config.component.as_str() == drafter::COMPONENT {
        Ok(())
    } else {
        Err(PluginError::invalid_input(format!(
            "plugin `native` has no component `{}`",
            config.component
        )))
    }
}

tandem_plugin_api::register_builtin!(NativePlugin);
