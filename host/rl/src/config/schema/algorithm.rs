//! `[algorithm]`: the RL algorithm's settings, GRPO's variants among them, each variant
//! named as in its paper.

use serde::{Deserialize, Serialize};

/// `[algorithm]`. The GRPO variants default to GRPO as the loop has always run it: PPO-clip
/// with `clip_eps` both ways, the token-mean loss with a per-token ratio, k3 KL in the loss,
/// group-scaled advantages, every prompt's group kept or dropped as it came.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmSection {
    /// Algorithm name: `grpo`, `ppo` (with a critic, `[critic]`), or `drafter` (train a
    /// drafter for the fixed model, see `[drafter]`).
    pub name: String,
    /// Prompts per step.
    pub prompts_per_step: u32,
    /// Completions per prompt (the GRPO group).
    pub group_size: u32,
    /// Max new tokens per completion.
    pub max_tokens: u32,
    /// Sampling temperature during rollouts.
    pub temperature: f32,
    /// Learning rate.
    pub learning_rate: f32,
    /// PPO clip range, both ways (default 0.2); with `clip_low` / `clip_high` leave it out.
    pub clip_eps: Option<f32>,
    /// Lower clip range: the ratio is clipped at `1 − clip_low` (default `clip_eps`).
    pub clip_low: Option<f32>,
    /// Upper clip range: the ratio is clipped at `1 + clip_high` (default `clip_eps`); DAPO's
    /// clip-higher sets it above `clip_low`, e.g. 0.28 against 0.2.
    pub clip_high: Option<f32>,
    /// How the per-token losses of a batch are summed into one (see [`LossAgg`]).
    pub loss_agg: LossAgg,
    /// Whose probability ratio is clipped: each token's, or the sequence's (GSPO).
    pub ratio: Ratio,
    /// KL penalty to the reference policy (0: no reference snapshot).
    pub kl_coef: f32,
    /// The KL estimator, in the loss or in the reward (`k1` or `k3`).
    pub kl_estimator: KlEstimator,
    /// Where the KL penalty goes: into the loss, or subtracted from each completion's reward
    /// before its advantage is computed.
    pub kl_in: KlIn,
    /// How a completion's reward minus its group's mean is scaled (see [`ScaleRewards`]).
    pub scale_rewards: ScaleRewards,
    /// DAPO's dynamic sampling: a group whose rewards are all equal is dropped and the next
    /// prompts of the task are sampled until `prompts_per_step` groups carry signal or
    /// `max_sampling_rounds` rounds were generated.
    pub dynamic_sampling: bool,
    /// Rollout rounds a step generates at most with `dynamic_sampling` (the first included).
    pub max_sampling_rounds: u32,
    /// Optimiser steps per RL step.
    pub train_steps_per_rollout: u32,
    /// Global gradient-norm clip.
    pub grad_clip: f32,
    /// PPO: the discount of GAE (1: an episode's reward counts fully at every token).
    pub gamma: f32,
    /// PPO: GAE's λ (1: Monte-Carlo returns; 0: one-step TD).
    pub lambda: f32,
    /// PPO: the critic's value clip range around the values the rollout was valued with
    /// (0: no clipping).
    pub value_clip: f32,
    /// PPO: the critic's learning rate (default: `learning_rate`).
    pub critic_learning_rate: Option<f32>,
    /// PPO: advantages are whitened over the batch's completion tokens (zero mean, unit
    /// standard deviation).
    pub whiten_advantages: bool,
}

/// The PPO clip range when neither `clip_eps` nor `clip_low` / `clip_high` is set.
pub const DEFAULT_CLIP_EPS: f32 = 0.2;

impl AlgorithmSection {
    /// The clip range `(low, high)`: `clip_low` / `clip_high`, each `clip_eps` (0.2) unless set.
    pub fn clip_range(&self) -> (f32, f32) {
        let eps = self.clip_eps.unwrap_or(DEFAULT_CLIP_EPS);
        (self.clip_low.unwrap_or(eps), self.clip_high.unwrap_or(eps))
    }

    /// PPO with a critic (`name = "ppo"`).
    pub fn is_ppo(&self) -> bool {
        self.name == "ppo"
    }

    /// The critic's learning rate.
    pub fn critic_lr(&self) -> f32 {
        self.critic_learning_rate.unwrap_or(self.learning_rate)
    }
}

impl Default for AlgorithmSection {
    fn default() -> Self {
        AlgorithmSection {
            name: "grpo".into(),
            prompts_per_step: 8,
            group_size: 8,
            max_tokens: 8,
            temperature: 1.0,
            learning_rate: 1e-3,
            clip_eps: None,
            clip_low: None,
            clip_high: None,
            loss_agg: LossAgg::default(),
            ratio: Ratio::default(),
            kl_coef: 0.0,
            kl_estimator: KlEstimator::default(),
            kl_in: KlIn::default(),
            scale_rewards: ScaleRewards::default(),
            dynamic_sampling: false,
            max_sampling_rounds: 4,
            train_steps_per_rollout: 1,
            grad_clip: 1.0,
            gamma: 1.0,
            lambda: 0.95,
            value_clip: 0.2,
            critic_learning_rate: None,
            whiten_advantages: true,
        }
    }
}

/// `[algorithm] loss_agg`: how a batch's per-token policy losses become one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    /// The sum over every completion token of the batch divided by their number (DAPO): a
    /// long completion weighs as much per token as a short one.
    #[default]
    TokenMean,
    /// Each completion's mean over its tokens, averaged over the completions (the GRPO
    /// paper): a long completion's tokens weigh less each.
    SeqMean,
    /// Each completion's sum over its tokens divided by the constant `max_tokens`, averaged
    /// over the completions (Dr. GRPO): no length bias either way.
    DrGrpo,
}

/// `[algorithm] ratio`: whose importance ratio PPO-clip clips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ratio {
    /// Each token's `π_θ / π_old`.
    #[default]
    Token,
    /// The sequence's length-normalised ratio `exp(mean_t(log π_θ − log π_old))`, one per
    /// completion (GSPO); its clip ranges are much smaller (GSPO uses 3e-4 / 4e-4).
    Sequence,
}

/// `[algorithm] kl_estimator`: the estimate of KL(π‖π_ref) per token, with `d = log π_ref −
/// log π`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlEstimator {
    /// `−d` (the log ratio): unbiased, may be negative.
    K1,
    /// `exp(d) − d − 1`: unbiased and never negative.
    #[default]
    K3,
}

/// `[algorithm] kl_in`: where the KL penalty `kl_coef` applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlIn {
    /// A term of the loss, per token.
    #[default]
    Loss,
    /// Subtracted from each completion's reward (`kl_coef` times its summed KL under the
    /// sampling policy) before the advantages; the loss has no KL term.
    Reward,
}

/// `[algorithm] scale_rewards`: what a completion's reward minus its group's mean is divided
/// by (plus 1e-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleRewards {
    /// The group's standard deviation (GRPO).
    #[default]
    Group,
    /// The standard deviation of every reward of the step.
    Batch,
    /// Nothing: the advantage is the reward minus the group's mean (Dr. GRPO).
    None,
}
