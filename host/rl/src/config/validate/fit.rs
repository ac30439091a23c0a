//! What the components' capabilities with their options rule out before anything starts:
//! prompts plus `max_tokens` longer than the engine holds (`max_seq_len`), and a drafter
//! job without a bridge that moves directories or an engine that drafts.

use super::issues::Issues;
use crate::config::JobFile;
use crate::config::plan::{BridgeSetup, CapsSource, RolePlan};
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
    let Some((longest, which)) = longest_prompt(j, model_path) else {
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

/// The longest prompt of the run in tokens, and which problem it is; `None` when the task or
/// the tokenizer cannot be built (their own checks report why) or the model does not exist yet.
fn longest_prompt(j: &JobFile, model_path: &Path) -> Option<(usize, String)> {
    if !model_path.join("tokenizer.json").is_file() {
        return None;
    }
    let codec = crate::prompt::PromptCodec::for_task(model_path, &j.task).ok()?;
    let task = crate::task::build_for_run(
        &j.task,
        j.run.seed,
        j.eval.enabled().then_some(j.eval.problems),
    )
    .ok()?;
    let per_step = u64::from(j.algorithm.prompts_per_step);
    let count = (u64::from(j.run.steps) * per_step).clamp(1, SCAN_LIMIT);
    let mut best: Option<(usize, String)> = None;
    let mut consider = |text: &str, which: String| {
        if let Ok(ids) = codec.prompt(text)
            && best.as_ref().is_none_or(|(n, _)| ids.len() > *n)
        {
            best = Some((ids.len(), which));
        }
    };
    for index in 0..count {
        let p = task.problem(index);
        consider(&p.prompt, format!("problem {index} of the task"));
    }
    if j.eval.enabled()
        && let Ok(held_out) = crate::task::HeldOut::new(&j.task, j.run.seed, j.eval.problems)
    {
        for (i, p) in held_out.problems().iter().enumerate() {
            consider(&p.prompt, format!("held-out problem {i}"));
        }
    }
    best
}
