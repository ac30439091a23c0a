//! What a component can do with the options a job gives it ([`ComponentCaps`]): asked of its
//! plugin (`describe_config`, API level 5) once the options are known; for a plugin below that
//! level, what its manifest declares, with nothing the manifest cannot say.

use serde::Serialize;
use tandem_plugin_api::{Capabilities, ConfigCaps, UpdateKind};

/// Where a component's capabilities came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapsSource {
    /// The plugin answered for these options (`describe_config`, API level 5).
    Options,
    /// The plugin's manifest (a plugin below API level 5): the same whatever the options.
    Manifest,
}

impl CapsSource {
    /// Where the capabilities came from, in words (`with these options`).
    pub fn describe(&self) -> &'static str {
        match self {
            CapsSource::Options => "with these options",
            CapsSource::Manifest => "as its manifest declares",
        }
    }
}

/// A component's capabilities with the job's options.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComponentCaps {
    /// Where they came from.
    pub source: CapsSource,
    /// Trainer: update kinds it exports (e.g. only adapters when it trains LoRA). Engine:
    /// kinds it applies. Bridge: export kind, then apply kind.
    #[serde(serialize_with = "kind_names")]
    pub update_kinds: Vec<UpdateKind>,
    /// Engine: hidden states. Trainer: steps on hidden states (a drafter trainer).
    pub hidden_states: bool,
    /// Engine: loads LoRA adapters. Trainer: trains LoRA adapters (with these options).
    pub lora: bool,
    /// Engine: draft tokens per speculative verification (0: none).
    pub draft_tokens: u32,
    /// Engine: it speculates only while at most this many rows decode (0: not applicable).
    pub speculate_below_batch: u32,
    /// The longest prompt + completion it handles (0: no limit known).
    pub max_seq_len: u32,
    /// Model presets it can create a model from.
    pub presets: Vec<String>,
    /// Engine: restarts on a checkpoint update instead of reloading in place.
    pub restarts_on_checkpoint: bool,
    /// Reports weight digests (what `[bridge] verify` checks).
    pub reports_digest: bool,
    /// Engine: `tandem serve` can put it behind HTTP.
    pub serves: bool,
    /// Trainer: can be a value model (a PPO critic).
    pub value_model: bool,
    /// Trainer: implements the policy-loss variants (`train_step_policy`).
    pub loss_variants: bool,
    /// Trainer: steps with per-token advantages (`train_step_advantages`: PPO's actor).
    pub token_advantages: bool,
}

/// An update kind as its name (`checkpoint_dir`).
pub(super) fn kind_name<S: serde::Serializer>(k: &UpdateKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(k.as_str())
}

/// Update kinds as their names.
fn kind_names<S: serde::Serializer>(k: &[UpdateKind], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(k.iter().map(|k| k.as_str()))
}

impl ComponentCaps {
    /// What a manifest declares: the same whatever the options; what it cannot say is off.
    pub fn from_manifest(caps: &Capabilities) -> ComponentCaps {
        ComponentCaps {
            source: CapsSource::Manifest,
            update_kinds: caps.update_kinds.iter().copied().collect(),
            hidden_states: caps.hidden_states,
            lora: caps.lora,
            draft_tokens: 0,
            speculate_below_batch: 0,
            max_seq_len: 0,
            presets: Vec::new(),
            restarts_on_checkpoint: false,
            reports_digest: false,
            serves: false,
            value_model: false,
            loss_variants: false,
            token_advantages: false,
        }
    }

    /// What the plugin answered for the options (`describe_config`); what only the manifest
    /// says (hidden states) comes from `manifest`.
    pub fn from_answer(answer: &ConfigCaps, manifest: &Capabilities) -> ComponentCaps {
        let update_kinds: Vec<UpdateKind> = answer.update_kinds.iter().copied().collect();
        ComponentCaps {
            source: CapsSource::Options,
            lora: manifest.lora && update_kinds.contains(&UpdateKind::Adapter),
            update_kinds,
            hidden_states: manifest.hidden_states,
            draft_tokens: answer.draft_tokens,
            speculate_below_batch: answer.speculate_below_batch,
            max_seq_len: answer.max_seq_len,
            presets: answer.presets.iter().map(ToString::to_string).collect(),
            restarts_on_checkpoint: answer.restarts_on_checkpoint,
            reports_digest: answer.reports_digest,
            serves: answer.serves,
            value_model: answer.value_model,
            loss_variants: answer.loss_variants,
            token_advantages: answer.token_advantages,
        }
    }

    /// The update kinds as their names.
    pub fn kind_names(&self) -> Vec<&'static str> {
        self.update_kinds.iter().map(|k| k.as_str()).collect()
    }
}
