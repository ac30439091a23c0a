//! `[algorithm]`: the values the GRPO loop (or a drafter job) cannot run with. A value
//! outside a variant's names (`loss_agg`, `ratio`, `kl_estimator`, `kl_in`,
//! `scale_rewards`) is refused by the parser at its key.

use super::issues::Issues;
use crate::config::{AlgorithmSection, JobFile, KlEstimator, KlIn, LossAgg, Ratio, RolePlan};

/// Values of `[algorithm]` the loop cannot run with.
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile) {
    let a = &j.algorithm;
    if !["grpo", "ppo", "drafter"].contains(&a.name.as_str()) {
        issues.at(
            "algorithm.name",
            format!("unknown algorithm `{}`", a.name),
            "use \"grpo\" (RL), \"ppo\" (RL with a critic, [critic]) or \"drafter\" (train a \
             speculative-decoding drafter)",
        );
    }
    for (key, v, what) in [
        ("prompts_per_step", a.prompts_per_step, "prompts per step"),
        ("max_tokens", a.max_tokens, "new tokens per completion"),
        (
            "train_steps_per_rollout",
            a.train_steps_per_rollout,
            "optimiser steps per RL step",
        ),
    ] {
        if v == 0 {
            issues.at(
                &format!("algorithm.{key}"),
                "must be at least 1",
                format!("it is the number of {what}"),
            );
        }
    }
    if a.name == "drafter" || a.is_ppo() {
        if a.group_size == 0 {
            issues.at(
                "algorithm.group_size",
                "must be at least 1",
                "it is the number of completions per prompt",
            );
        }
    } else if a.group_size < 2 {
        issues.at(
            "algorithm.group_size",
            format!(
                "GRPO needs groups of at least 2 completions, got {}",
                a.group_size
            ),
            "set group_size = 8",
        );
    }
    rates(issues, a);
    variants(issues, a);
    if a.dynamic_sampling && j.drafter.enabled && !j.is_drafter_job() {
        // The bubble's drafter training releases an engine's memory once its share of the
        // first round is in: there is no engine left to sample a second round on.
        issues.at(
            "algorithm.dynamic_sampling",
            "dynamic sampling cannot run beside the drafter trained in the rollout's bubbles",
            "set dynamic_sampling = false, or [drafter] enabled = false",
        );
    }
}

/// The clip ranges and the GRPO variants that need other keys.
fn variants(issues: &mut Issues<'_>, a: &AlgorithmSection) {
    if a.clip_eps.is_some() {
        for key in ["clip_low", "clip_high"] {
            let set = if key == "clip_low" {
                a.clip_low
            } else {
                a.clip_high
            };
            if set.is_some() {
                issues.at(
                    &format!("algorithm.{key}"),
                    format!("`{key}` and `clip_eps` are both set"),
                    "leave out clip_eps: it is the clip range both ways, clip_low / clip_high \
                     set each (e.g. clip_low = 0.2, clip_high = 0.28)",
                );
            }
        }
    }
    if a.kl_in == KlIn::Reward && a.kl_coef == 0.0 {
        issues.at(
            "algorithm.kl_in",
            "kl_in = \"reward\" with kl_coef = 0 puts no KL penalty anywhere",
            "set kl_coef > 0 (e.g. kl_coef = 0.05), or leave out kl_in",
        );
    }
    if a.dynamic_sampling && a.max_sampling_rounds == 0 {
        issues.at(
            "algorithm.max_sampling_rounds",
            "must be at least 1",
            "it bounds the rollout rounds of a step with dynamic sampling, e.g. max_sampling_rounds = 4",
        );
    }
}

/// The loss variants only a trainer that implements them (`loss_variants`: its
/// `train_step_policy`) trains with: an aggregation other than the token mean, the
/// sequence ratio, the k1 estimator in the loss.
pub(super) fn check_trainer(issues: &mut Issues<'_>, a: &AlgorithmSection, trainer: &RolePlan) {
    if trainer.caps.loss_variants || a.name == "drafter" {
        return;
    }
    let kl_in_loss = a.kl_in == KlIn::Loss && a.kl_coef > 0.0;
    for (key, set, default) in [
        ("loss_agg", a.loss_agg != LossAgg::TokenMean, "token-mean"),
        ("ratio", a.ratio != Ratio::Token, "token"),
        (
            "kl_estimator",
            kl_in_loss && a.kl_estimator != KlEstimator::K3,
            "k3",
        ),
    ] {
        if set {
            issues.at(
                &format!("algorithm.{key}"),
                format!(
                    "trainer `{}` (plugin `{}`) does not implement the policy-loss variants",
                    trainer.component, trainer.plugin
                ),
                format!(
                    "use {key} = \"{default}\" (the default), or a trainer that implements them (see `tandem plugins`)"
                ),
            );
        }
    }
}

/// The sampling temperature and the optimiser's numbers.
fn rates(issues: &mut Issues<'_>, a: &AlgorithmSection) {
    let float = |v: f32, ok: fn(f32) -> bool| v.is_finite() && ok(v);
    for (key, v, ok, rule, help) in [
        (
            "temperature",
            a.temperature,
            (|v| v >= 0.0) as fn(f32) -> bool,
            ">= 0",
            "0 samples greedily; 1.0 samples from the model's distribution",
        ),
        (
            "learning_rate",
            a.learning_rate,
            |v| v > 0.0,
            "> 0",
            "e.g. learning_rate = 0.0003",
        ),
        (
            "clip_eps",
            a.clip_eps.unwrap_or(0.0),
            |v| v >= 0.0,
            ">= 0",
            "the PPO clip range, e.g. clip_eps = 0.2",
        ),
        (
            "clip_low",
            a.clip_low.unwrap_or(0.0),
            |v| (0.0..1.0).contains(&v),
            "in [0, 1)",
            "the ratio is clipped at 1 - clip_low, e.g. clip_low = 0.2",
        ),
        (
            "clip_high",
            a.clip_high.unwrap_or(0.0),
            |v| v >= 0.0,
            ">= 0",
            "the ratio is clipped at 1 + clip_high, e.g. clip_high = 0.28",
        ),
        (
            "kl_coef",
            a.kl_coef,
            |v| v >= 0.0,
            ">= 0",
            "0 disables the KL penalty (and the reference snapshot)",
        ),
        (
            "grad_clip",
            a.grad_clip,
            |v| v > 0.0,
            "> 0",
            "the global gradient-norm clip, e.g. grad_clip = 1.0",
        ),
    ] {
        if !float(v, ok) {
            issues.at(
                &format!("algorithm.{key}"),
                format!("must be a number {rule}, got {v}"),
                help,
            );
        }
    }
}
