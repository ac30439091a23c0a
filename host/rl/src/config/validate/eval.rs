//! `[eval]`: the held-out set's size and answer length (whether the environment has a
//! held-out split, and room for it, is the environment's check).

use super::issues::Issues;
use crate::config::JobFile;

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
}
