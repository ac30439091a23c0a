//! `[eval]`: the held-out set's size and answer length, and a split that leaves the training
//! stream room (see [`crate::task::split`]).

use super::issues::Issues;
use crate::config::JobFile;
use crate::task::split::{HeldOut, PROBE, TrainStream};

/// Largest held-out set.
const MAX_PROBLEMS: u32 = 100_000;

/// Values of `[eval]` the run cannot evaluate with.
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile) {
    let e = &j.eval;
    if e.problems == 0 || e.problems > MAX_PROBLEMS {
        issues.at(
            "eval.problems",
            format!("{} is out of range", e.problems),
            format!("the held-out set needs 1..={MAX_PROBLEMS} problems, e.g. problems = 64"),
        );
        return;
    }
    if e.max_tokens == Some(0) {
        issues.at(
            "eval.max_tokens",
            "must be at least 1",
            "it is the number of new tokens per answer; leave it out to use [algorithm] max_tokens",
        );
    }
    if !e.enabled() {
        return;
    }
    // An invalid task is reported at its key by `[task]`'s check.
    let (Ok(held_out), true) = (
        HeldOut::new(&j.task, j.run.seed, e.problems),
        crate::task::build(&j.task, j.run.seed).is_ok(),
    ) else {
        return;
    };
    let Ok(train) = TrainStream::new(&j.task, j.run.seed, held_out) else {
        return;
    };
    let collisions = train.collisions(PROBE);
    if collisions * 2 > PROBE {
        issues.at(
            "eval.problems",
            format!(
                "a held-out set of {} problems covers {collisions} of the first {PROBE} training \
                 problems: the task has too few distinct problems to hold that many out",
                e.problems
            ),
            "hold out fewer problems, or widen the task (e.g. more digits or a larger max_operand)",
        );
    }
}
