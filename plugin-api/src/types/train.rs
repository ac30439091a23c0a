//! Training: batches of sequences with their RL signals, loss settings, and what a trainer
//! reports about itself and its checkpoints.

use abi_stable::StableAbi;
use abi_stable::std_types::{RString, RVec};
use serde::{Deserialize, Serialize};

/// One sequence of a training batch: prompt + completion tokens and their RL signals.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TrainSequence {
    /// Prompt followed by completion token ids.
    #[serde(with = "crate::wire::packed")]
    pub tokens: RVec<u32>,
    /// Number of prompt tokens at the start of `tokens`; loss covers only the rest.
    pub prompt_len: u32,
    /// Sequence-level advantage (GRPO) or `0.0` for SFT.
    pub advantage: f32,
    /// Logprobs of the completion tokens under the policy that sampled them (may be empty).
    #[serde(with = "crate::wire::packed")]
    pub old_logprobs: RVec<f32>,
    /// Logprobs of the completion tokens under the reference policy (empty: no KL term).
    #[serde(with = "crate::wire::packed")]
    pub ref_logprobs: RVec<f32>,
}

/// Which loss `train_step` minimises.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossKind {
    /// PPO-clip policy loss with group-relative advantages and optional KL to the reference.
    Grpo,
    /// Plain cross-entropy on the completion tokens (warm starts).
    Sft,
}

/// Loss and optimiser settings of one train step.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LossConfig {
    /// Which loss.
    pub kind: LossKind,
    /// Lower PPO clip range (ratio ≥ 1 − eps_low).
    pub clip_eps_low: f32,
    /// Upper PPO clip range (ratio ≤ 1 + eps_high).
    pub clip_eps_high: f32,
    /// Weight of the KL penalty to the reference policy (0 disables it).
    pub kl_coef: f32,
    /// Learning rate of this step.
    pub learning_rate: f32,
    /// Global gradient-norm clip (0 disables it).
    pub grad_clip: f32,
}

/// A batch for `compute_logprobs` / `train_step`.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TrainBatch {
    /// Sequences of the batch.
    pub sequences: RVec<TrainSequence>,
    /// Loss settings (ignored by `compute_logprobs`).
    pub loss: LossConfig,
}

/// Which weights `compute_logprobs` uses.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum WhichWeights {
    /// The weights currently loaded (the actor, normally).
    Current,
    /// A named snapshot (e.g. `ref`), without disturbing the current weights.
    Snapshot(RString),
}

/// What a trainer reports after `init`.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TrainerInfo {
    /// Number of trainable parameters.
    pub trainable_params: u64,
    /// Total number of parameters.
    pub total_params: u64,
    /// Weight version of the loaded weights.
    pub weight_version: u64,
}

/// Checkpoint written or read by a trainer.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CheckpointInfo {
    /// Directory of the checkpoint.
    pub dir: RString,
    /// Weight version stored in it.
    pub weight_version: u64,
    /// Bytes written or read.
    pub bytes: u64,
}

/// How a policy loss sums its per-token terms into one number (see the written definition in
/// `plugins/native/core/src/loss.rs`). Every normaliser is taken over the whole batch of the
/// step, whatever micro-batches or data-parallel ranks a trainer splits it into.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LossAggregation {
    /// `Σ mask·ℓ / Σ mask`: every completion token of the batch weighs the same (DAPO).
    #[default]
    TokenMean,
    /// The mean over sequences of each sequence's token mean (GRPO's paper, GSPO).
    SequenceMean,
    /// `Σ mask·ℓ / (B · constant_length)` (Dr. GRPO): no length bias.
    ConstantLength,
}

/// The level the importance ratio is taken at.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RatioLevel {
    /// `r_t = exp(lp_t − old_t)`, clipped per token (PPO, GRPO).
    #[default]
    Token,
    /// `s_b = exp(mean over the completion of (lp − old))`, clipped per sequence (GSPO).
    Sequence,
}

/// The estimator of the KL to the reference policy in the loss.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `lp − ref`.
    K1,
    /// `exp(ref − lp) − (ref − lp) − 1` (≥ 0).
    #[default]
    K3,
}

/// The policy-loss variant of one `train_step_policy` (API level
/// [`PLAN`](crate::api_level::PLAN)); the clip range and KL weight stay in the batch's
/// [`LossConfig`]. [`PolicyLoss::default`] is exactly the loss `train_step` minimises.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyLoss {
    /// How per-token terms are summed.
    pub aggregation: LossAggregation,
    /// Dr. GRPO's normaliser per sequence (the generation budget, `max_tokens`); read by
    /// [`LossAggregation::ConstantLength`] only, which needs it > 0.
    pub constant_length: u32,
    /// Token or sequence (GSPO) importance ratio.
    pub ratio: RatioLevel,
    /// KL estimator of the penalty to the reference.
    pub kl_estimator: KlEstimator,
}

impl PolicyLoss {
    /// `true` for the loss `train_step` minimises (token mean, token ratio, k3), whatever
    /// `constant_length` says (only the constant-length aggregation reads it).
    pub fn is_default(&self) -> bool {
        self.aggregation == LossAggregation::TokenMean
            && self.ratio == RatioLevel::Token
            && self.kl_estimator == KlEstimator::K3
    }

    /// Why a trainer cannot apply this variant to a batch whose loss is `kind`, in one line
    /// (a variant on an SFT batch; the constant-length aggregation without a length); `None`
    /// when it can.
    pub fn problem(&self, kind: LossKind) -> Option<String> {
        if kind == LossKind::Sft && !self.is_default() {
            return Some(format!(
                "the policy-loss variant {self:?} applies to the GRPO loss, this batch is SFT"
            ));
        }
        (self.aggregation == LossAggregation::ConstantLength && self.constant_length == 0).then(
            || {
                "the constant-length aggregation needs constant_length > 0 (the generation \
                 budget, max_tokens)"
                    .to_owned()
            },
        )
    }
}

/// Per-token advantages of a batch for [`Trainer::train_step_advantages`]
/// (API level [`PLAN`](crate::api_level::PLAN)): one row per sequence of the batch, one entry
/// per completion token (PPO's advantages from a critic, GAE).
///
/// [`Trainer::train_step_advantages`]: crate::traits::Trainer::train_step_advantages
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct TokenAdvantages {
    /// Row `i` holds the advantage of each completion token of sequence `i`.
    #[serde(with = "crate::wire::packed::nested")]
    pub rows: RVec<RVec<f32>>,
}

/// The targets of a value model's step, [`Trainer::train_step_value`] (API level
/// [`PLAN`](crate::api_level::PLAN)). A value row has one entry per completion token: entry `j`
/// of sequence `i` is the value of the state that emits completion token `j` (the prefix
/// `tokens[..prompt_len + j]`). The loss, written once in `plugins/native/core/src/value.rs`,
/// is `½ · mean over the batch's completion tokens of max((v − R)², (clip(v, v_old − c, v_old
/// + c) − R)²)`, the second term only with `clip > 0`.
///
/// [`Trainer::train_step_value`]: crate::traits::Trainer::train_step_value
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ValueTargets {
    /// The return `R` of each completion token (GAE's λ-return).
    #[serde(with = "crate::wire::packed::nested")]
    pub returns: RVec<RVec<f32>>,
    /// The values the rollout was valued with (`v_old`); empty rows when `clip` is 0.
    #[serde(with = "crate::wire::packed::nested")]
    pub old_values: RVec<RVec<f32>>,
    /// Value clip range `c` (0: no clipping).
    pub clip: f32,
}
