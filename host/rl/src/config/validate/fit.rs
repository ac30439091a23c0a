//! What the components' capabilities with their options rule out before anything starts:
//! prompts plus `max_tokens` (with tools: a trajectory's token budget) longer than the engine
//! holds (`max_seq_len`), and a drafter
//! job without a bridge that moves directories or an engine that drafts.

use super::issues::Issues;
use crate::config::JobFile;
use crate::config::plan::{BridgeSetup, CapsSource, RolePlan};
use crate::env::Env;
use std::path::Path;
use tandem_plugin_api::UpdateKind;

/// Problems of the task stream scanned for the longest prompt: the whole run's, up to this
/// many (the built-in tasks draw every problem from one small distribution).
const SCAN_LIMIT: u64 = 20_000;

/// The checks.
pub(super) fn check(
    issues: &mut Issues<'_>,
    j: &JobFile,
    model_path: &Path,
    engine: &RolePlan,
    bridge: &BridgeSetup,
    env: Option<&Env>,
) {
    if j.is_drafter_job() {
        if bridge.export != UpdateKind::CheckpointDir {
            issues.push(
                super::bridge::plugin_key(issues.job),
                Some(j.bridge.plugin.span()),
                format!(
                    "a drafter job moves the drafter to the engines as a directory, but bridge `{}` moves {} updates",
                    bridge.component,
                    bridge.export.as_str()
                ),
                "set plugin = \"checkpoint\" (a bridge that moves checkpoint directories)".into(),
            );
        }
        if engine.caps.source == CapsSource::Options && engine.caps.draft_tokens == 0 {
            issues.at(
                "engine.plugin",
                format!(
                    "a drafter job measures speculative decoding, but engine `{}` (plugin `{}`) drafts no tokens with its options",
                    engine.component, engine.plugin
                ),
                "use an engine that speculates with a drafter (see `tandem plugins`)",
            );
        }
    }
    let limit = engine.caps.max_seq_len;
    if limit == 0 {
        return;
    }
    let Some((longest, which)) = longest_prompt(j, model_path, env) else {
        return;
    };
    let a = &j.algorithm;
    let mut needs = vec![(a.max_tokens, "algorithm.max_tokens")];
    if let Some(e) = j.eval.max_tokens.filter(|_| j.eval.enabled()) {
        needs.push((e, "eval.max_tokens"));
    }
    if let Some(e) = j.drafter.eval_max_tokens.filter(|_| j.is_drafter_job()) {
        needs.push((e, "drafter.eval_max_tokens"));
    }
    for (max_tokens, key) in needs {
        // With tools a trajectory holds up to its budget after the prompt.
        let max_tokens = crate::turns::after_prompt(j.environment(), max_tokens);
        let total = longest + max_tokens as usize;
        if total > limit as usize {
            issues.at(
                key,
                format!(
                    "the longest prompt ({longest} tokens, {which}) + {max_tokens} new tokens = {total} \
                     exceeds the {limit} tokens engine `{}` holds with its options (max_seq_len)",
                    engine.component
                ),
                format!(
                    "raise the engine's max_seq_len to at least {total} in [engine.options], or lower {key} to {}",
                    (limit as usize).saturating_sub(longest)
                ),
            );
        }
    }
}

/// The longest prompt of the run in tokens, and which problem it is; `None` when the
/// environment or the tokenizer cannot be built (their own checks report why) or the model
/// does not exist yet. An item the environment cannot give while only checked (one that
/// starts workers to answer) ends the scan.
fn longest_prompt(j: &JobFile, model_path: &Path, env: Option<&Env>) -> Option<(usize, String)> {
    let env = env?;
    if !model_path.join("tokenizer.json").is_file() {
        return None;
    }
    let codec = crate::prompt::PromptCodec::for_env(model_path, j.environment()).ok()?;
    let per_step = u64::from(j.algorithm.prompts_per_step);
    let mut count = (u64::from(j.run.steps) * per_step).clamp(1, SCAN_LIMIT);
    if let Some(size) = env
        .split_size(tandem_plugin_api::TRAIN_SPLIT)
        .filter(|&n| n > 0)
    {
        count = count.min(size);
    }
    let mut best: Option<(usize, String)> = None;
    let mut consider = |problem: &crate::env::Problem, which: String| {
        if let Ok(ids) = codec.prompt_of(problem)
            && best.as_ref().is_none_or(|(n, _)| ids.len() > *n)
        {
            best = Some((ids.len(), which));
        }
    };
    for index in 0..count {
        let Ok(p) = env.problem(index) else { break };
        consider(&p, format!("problem {index} of the environment"));
    }
    let held = super::environment::held_out(j);
    if held > 0
        && let Ok(held_out) = env.held_out(held)
    {
        for (i, p) in held_out.iter().enumerate() {
            consider(p, format!("held-out problem {i}"));
        }
    }
    best
}
