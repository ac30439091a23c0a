//! `[run] dump_rollouts = true`: every sample of every step appended to
//! `<run_dir>/rollouts.jsonl`, one JSON object per line — `step`, `group`, the decoded
//! `prompt` and `completion`, the completion's `tokens` and sampling `logprobs`, `reward`
//! and GRPO `advantage`, the `policy_version` that generated it and the `trained_version`
//! of the weights it trained (their difference is its staleness) — for looking at what the
//! policy generates. With tools each assistant turn is a line with its `trajectory` (its id,
//! `step.n`: never reused, a retried trajectory gets a new one), `turn`
//! of `turns` and `prompt_tokens` (everything before the turn, exactly as the engine saw
//! it); a trajectory's last line also has its `trajectory_tokens` (the ids after its first
//! prompt) and their `mask` (1: the engine's, trained; 0: tools' and template's). A debugging
//! aid: a
//! failed write never stops the run.

use crate::prompt::PromptCodec;
use crate::rollout::Rollout;
use std::io::Write as _;
use std::path::Path;

/// Appends the samples of `step` (with their advantages) to `path`.
pub(super) fn append(
    path: &Path,
    step: u32,
    rollout: &Rollout,
    advantages: &[f32],
    codec: &PromptCodec,
    trained_version: u64,
) {
    let mut text = String::new();
    for (i, (s, a)) in rollout.samples.iter().zip(advantages).enumerate() {
        let mut line = serde_json::json!({
            "step": step,
            "policy_version": s.version,
            "trained_version": trained_version,
            "group": s.group,
            "prompt": codec.decode(&s.prompt).unwrap_or_default(),
            "completion": codec.decode(&s.completion).unwrap_or_default(),
            "tokens": s.completion,
            "logprobs": s.logprobs,
            "reward": s.reward,
            "advantage": a,
        });
        if let Some(t) = s.turn {
            line["trajectory"] = format!("{step}.{}", t.trajectory).into();
            line["turn"] = t.index.into();
            line["turns"] = t.of.into();
            line["prompt_tokens"] = s.prompt.clone().into();
            if t.index + 1 == t.of
                && let Some((ids, mask)) = crate::turns::ending(&rollout.samples[..=i])
            {
                line["trajectory_tokens"] = ids.into();
                line["mask"] = mask.into();
            }
        }
        text.push_str(&line.to_string());
        text.push('\n');
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    let written = file.and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        tracing::warn!("cannot write {}: {e}", path.display());
    }
}
