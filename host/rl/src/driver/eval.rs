//! The `[eval]` phase: greedy accuracy on the held-out set ([`crate::eval`]) through the
//! run's engines, before the first step (step 0), every `every` steps and after the last.
//!
//! It runs when the engines serve (after the init's staged onload, or after a step's
//! `continue_generation`), on every engine rank in parallel, under the adapter rollouts use.
//! It reads neither the data position nor the rollout seeds (those come from the step number)
//! and every request carries its own seed, so a run trains the same with and without it.
//! With tools each held-out problem runs its turns as rollouts do, and its last turn is
//! the answer. Step 0's figures are a line of their own in `metrics.jsonl` (`step`, `weight_version`,
//! `eval_accuracy`, `eval_problems`); later ones go into their step's line. Every evaluation
//! also appends its answers to `eval.jsonl` (what the model answered, problem by problem).
//!
//! On `--resume` the schedule goes on from the checkpoint's step: step 0 is not evaluated
//! again, and when the checkpoint's own line lacks its evaluation (the run died between the
//! save and the line) it is evaluated on the resumed weights — the checkpoint's — and the
//! line amended; `eval.jsonl` loses the evaluations of the steps that run again.

use super::Loop;
use crate::error::RlError;
use crate::eval::{Answer, EvalResult, EvalSet};
use std::io::Write as _;
use std::path::Path;
use tandem_plugin_api::GenerateResponse;

/// The run's evaluation: the held-out set and its schedule.
pub(super) struct Evaluation {
    /// The held-out set, encoded.
    pub set: EvalSet,
    /// Evaluate every N steps.
    pub every: u32,
}

impl Loop<'_> {
    /// Whether `step` (0: before the first) is evaluated.
    pub(super) fn eval_due(&self, step: u32) -> bool {
        self.eval.as_ref().is_some_and(|e| {
            step == 0 || step.is_multiple_of(e.every) || step == self.cursor.total_steps
        })
    }

    /// Greedy accuracy of the served weights on the held-out set.
    pub(super) fn evaluate(&self, step: u32) -> Result<EvalResult, RlError> {
        let Some(eval) = &self.eval else {
            return Err(RlError::failed("evaluation without an [eval] section"));
        };
        // Generation is legal only on serving engines: checked on every machine first.
        if let Some((rank, m)) =
            (self.engines.machines.iter().enumerate()).find(|(_, m)| !m.can_generate())
        {
            return Err(RlError::failed(format!(
                "evaluation at step {step}: engine rank {rank} is {:?}, not serving",
                m.state()
            )));
        }
        let ranks = self.engines.remotes.len();
        let adapter = self.bridge.request_adapter();
        let replies: Vec<Result<Option<GenerateResponse>, RlError>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .engines
                .remotes
                .iter()
                .enumerate()
                .map(|(rank, engine)| {
                    let request = eval.set.request(rank, ranks, adapter.as_deref());
                    let codec = &self.codec;
                    s.spawn(move || match request {
                        Some(r) => crate::turns::answers(r, codec, &mut |r| {
                            engine.generate(r).map_err(RlError::from)
                        })
                        .map(Some),
                        None => Ok(None),
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(RlError::failed("an evaluation thread panicked")))
                })
                .collect()
        });
        let replies = replies.into_iter().collect::<Result<Vec<_>, _>>()?;
        let answers = eval.set.answers(&self.env, &self.codec, &replies)?;
        let result = EvalResult::of(&answers);
        self.events.record(
            step,
            "loop",
            "eval",
            &format!("{}/{} right", result.correct, result.problems),
        );
        append_answers(&self.files.eval, step, &result, &answers);
        Ok(result)
    }

    /// Before the first step: step 0's evaluation on a fresh run, or on `--resume` the
    /// checkpoint step's when its line lacks it (see the module doc).
    pub(super) fn eval_at_start(&mut self) -> Result<(), RlError> {
        if self.eval.is_none() {
            return Ok(());
        }
        let step = self.cursor.first_step.saturating_sub(1);
        if self.opts.resume {
            keep_answers_until(&self.files.eval, step);
        }
        let recorded = self
            .metrics
            .steps
            .iter()
            .any(|m| m.step == step && m.eval_accuracy.is_some());
        let line = self.metrics.steps.iter().any(|m| m.step == step);
        if recorded || !self.eval_due(step) || (step > 0 && !line) {
            return Ok(());
        }
        let result = self.evaluate(step)?;
        let line = format!(
            "eval at step {step}: accuracy {:.1}% ({}/{}) on the held-out set",
            result.accuracy() * 100.0,
            result.correct,
            result.problems
        );
        self.progress.println(&line);
        if step == 0 {
            self.metrics
                .push_before(self.engines.min_version(), &result)
        } else {
            self.metrics.amend_eval(step, &result)
        }
    }
}

/// Appends one evaluation to `eval.jsonl`: `step`, `accuracy`, `correct`, `problems` and
/// every problem's `answers` (`prompt`, `answer`, `completion`, `right`). A record to read,
/// not state: a failed write is a warning.
fn append_answers(path: &Path, step: u32, result: &EvalResult, answers: &[Answer]) {
    let line = serde_json::json!({
        "step": step,
        "accuracy": result.accuracy(),
        "correct": result.correct,
        "problems": result.problems,
        "answers": answers,
    });
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        tracing::warn!("cannot write {}: {e}", path.display());
    }
}

/// On `--resume`: drops the evaluations of steps after `step` (they run again).
fn keep_answers_until(path: &Path, step: u32) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= u64::from(step))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    if let Err(e) = std::fs::write(path, kept) {
        tracing::warn!("cannot rewrite {}: {e}", path.display());
    }
}
