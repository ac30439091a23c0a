//! `[algorithm]`: the values the GRPO loop (or a drafter job) cannot run with.

use super::issues::Issues;
use crate::config::AlgorithmSection;

/// Values of `[algorithm]` the loop cannot run with.
pub(super) fn check(issues: &mut Issues<'_>, a: &AlgorithmSection) {
    if a.name != "grpo" && a.name != "drafter" {
        issues.at(
            "algorithm.name",
            format!("unknown algorithm `{}`", a.name),
            "use \"grpo\" (RL) or \"drafter\" (train a speculative-decoding drafter)",
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
    if a.name == "drafter" {
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
            a.clip_eps,
            |v| v >= 0.0,
            ">= 0",
            "the PPO clip range, e.g. clip_eps = 0.2",
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
