//! `[environment] tools`: multi-turn rollouts (`crate::turns`). Each one line at its key: a
//! tool that is not built in, a format no parser reads, fewer than two turns, a budget
//! smaller than one turn, tools without chat prompts; and what trains a multi-turn
//! trajectory differently from its turns (each turn is a sample whose prompt is everything
//! before it): PPO's critic, the per-sequence loss aggregations and ratio, KL in the reward,
//! a drafter in the bubbles. The template's own checks (its format, append-only with a tool
//! turn) run with the chat check, on the model's files.

use super::issues::Issues;
use crate::config::{JobFile, KlIn, LossAgg, Ratio};
use tandem_model::tools::{BUILTIN_TOOLS, ToolFamily};

/// Checks `[environment]`'s tool keys and what the algorithm does with multi-turn samples.
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile) {
    let table = j.environment_table();
    let e = j.environment();
    if e.tools.is_empty() || j.is_drafter_job() {
        for (set, key) in [
            (e.tool_format.is_some(), "tool_format"),
            (e.max_trajectory_tokens.is_some(), "max_trajectory_tokens"),
            (e.tool_prompt.is_some(), "tool_prompt"),
        ] {
            if set && !j.is_drafter_job() {
                issues.at(
                    &format!("{table}.{key}"),
                    format!("{key} applies to multi-turn rollouts, and the job has no tools"),
                    format!("add tools = [\"calculate\"] to [{table}], or remove {key}"),
                );
            }
        }
        return;
    }
    let key = format!("{table}.tools");
    if !e.chat {
        issues.at(
            &key,
            "tools need chat prompts: a tool's answer is a message of the chat template",
            format!("set chat = true in [{table}]"),
        );
    }
    for t in e
        .tools
        .iter()
        .filter(|t| !BUILTIN_TOOLS.contains(&t.as_str()))
    {
        issues.at(
            &key,
            format!("unknown tool `{t}`"),
            format!("the built-in tools: {}", BUILTIN_TOOLS.join(", ")),
        );
    }
    if let Some(f) = &e.tool_format
        && let Err(err) = ToolFamily::from_name(f)
    {
        issues.at(
            &format!("{table}.tool_format"),
            err.to_string(),
            "hermes: <tool_call> JSON (Qwen2.5, Qwen3, Hermes); llama3: a JSON object with \
             \"parameters\"",
        );
    }
    if e.max_turns < 2 {
        issues.at(
            &format!("{table}.max_turns"),
            format!(
                "max_turns = {} leaves no turn after a tool's answer",
                e.max_turns
            ),
            "use max_turns >= 2 (a call, then the answer after the tool's), e.g. 4",
        );
    }
    let max_tokens = j.algorithm.max_tokens;
    if let Some(b) = e.max_trajectory_tokens
        && b < max_tokens
    {
        issues.at(
            &format!("{table}.max_trajectory_tokens"),
            format!("{b} is less than one turn ([algorithm] max_tokens = {max_tokens})"),
            "use at least max_tokens per turn you allow, e.g. max_turns x max_tokens",
        );
    }
    let a = &j.algorithm;
    let per_sequence = [
        (
            a.is_ppo(),
            "algorithm.name",
            "PPO's critic values each turn on its own",
        ),
        (
            a.loss_agg == LossAgg::SeqMean,
            "algorithm.loss_agg",
            "loss_agg = \"seq-mean\" would weigh each turn as a sequence",
        ),
        (
            a.loss_agg == LossAgg::DrGrpo,
            "algorithm.loss_agg",
            "loss_agg = \"dr-grpo\" would count each turn as a sequence",
        ),
        (
            a.ratio == Ratio::Sequence,
            "algorithm.ratio",
            "ratio = \"sequence\" would take one ratio per turn, not per trajectory",
        ),
        (
            a.kl_in == KlIn::Reward && a.kl_coef > 0.0,
            "algorithm.kl_in",
            "kl_in = \"reward\" would subtract each turn's KL from the trajectory's reward",
        ),
        (
            j.drafter.enabled,
            "drafter.enabled",
            "the drafter trains in the bubbles of single-turn rollouts",
        ),
    ];
    for (bad, at, why) in per_sequence {
        if bad {
            issues.at(
                at,
                format!("multi-turn rollouts ([{table}] tools) train each turn as a sample: {why}"),
                "use GRPO with the token-mean loss, the token ratio and the KL in the loss, \
                 or remove tools",
            );
        }
    }
}
