//! Options of the trainer component (`options` table of the job file, as JSON).

use serde::Deserialize;
use tandem_native_core::lora::{ALL_TARGETS, Target};
use tandem_native_core::optim::AdamW;
use tandem_plugin_api::PluginError;
use tandem_plugin_api::sdk::Result;

/// `options.lora`: train a LoRA adapter on a frozen base.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraOptions {
    /// Rank.
    pub rank: usize,
    /// Scaling numerator (`scale = alpha / rank`).
    pub alpha: f32,
    /// PEFT module names (default: all seven projections).
    #[serde(default)]
    pub targets: Vec<String>,
    /// Seed of A's initialisation.
    #[serde(default)]
    pub seed: u64,
}

/// `options` of the trainer component (the learning rate and clip come with each step).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerOptions {
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// AdamW β1.
    pub beta1: f32,
    /// AdamW β2.
    pub beta2: f32,
    /// AdamW ε.
    pub eps: f32,
    /// LoRA mode.
    pub lora: Option<LoraOptions>,
    /// Compute the weight digest on every export (default). `false` saves one pass over the
    /// exported weights per sync; bridges with `verify` on then refuse the update.
    pub digest: bool,
    /// Init preset (`tiny`, `small`, `big`) written into `model_path` by the constructor when
    /// that directory is absent or empty (no `config.json`); ignored when a model is there.
    pub init_preset: Option<String>,
    /// Seed of the preset's random weights.
    pub init_seed: u64,
    /// Most padded tokens per micro-batch of a step (gradient accumulation; the loss keeps
    /// the whole batch's normalisation). Also sizes the activations once at init, so memory
    /// is flat from the first step. `None`: the whole batch in one pass.
    pub micro_batch_tokens: Option<usize>,
    /// Most sequences per micro-batch (`None`: no limit).
    pub micro_batch_sequences: Option<usize>,
    /// Memory budget of the LM head's chunk (hidden rows + logits over the vocabulary), MiB.
    pub head_chunk_mib: usize,
}

impl Default for TrainerOptions {
    fn default() -> Self {
        let a = AdamW::default();
        TrainerOptions {
            weight_decay: 0.0,
            beta1: a.beta1,
            beta2: a.beta2,
            eps: a.eps,
            lora: None,
            digest: true,
            init_preset: None,
            init_seed: 0,
            micro_batch_tokens: None,
            micro_batch_sequences: None,
            head_chunk_mib: tandem_native_core::head::HEAD_BUDGET_BYTES >> 20,
        }
    }
}

/// PEFT module names -> targets (empty: all seven projections).
pub(super) fn parse_targets(names: &[String]) -> Result<Vec<Target>> {
    if names.is_empty() {
        return Ok(ALL_TARGETS.to_vec());
    }
    names
        .iter()
        .map(|n| {
            Target::from_module(n).ok_or_else(|| {
                PluginError::invalid_input(format!(
                    "trainer `native` options: lora target `{n}` is not one of q_proj, k_proj, \
                     v_proj, o_proj, gate_proj, up_proj, down_proj"
                ))
            })
        })
        .collect()
}
