//! `[run]`: the restart budget (`max_restarts`, `max_restarts_per_run`,
//! `restart_backoff_secs`).

use super::issues::Issues;
use crate::config::RunSection;

/// Longest first wait before a restart (s).
const MAX_BACKOFF_SECS: f64 = 600.0;

/// Values of `[run]` the loop cannot recover with.
pub(super) fn check(issues: &mut Issues<'_>, run: &RunSection) {
    let b = run.restart_backoff_secs;
    if !b.is_finite() || !(0.0..=MAX_BACKOFF_SECS).contains(&b) {
        issues.at(
            "run.restart_backoff_secs",
            format!("{b} is out of range"),
            format!("the wait before a restart is 0..={MAX_BACKOFF_SECS} s, e.g. 1.0"),
        );
    }
    if run.max_restarts > run.max_restarts_per_run {
        issues.at(
            "run.max_restarts",
            format!(
                "{} restarts per rank exceed the {} of the whole run (max_restarts_per_run)",
                run.max_restarts, run.max_restarts_per_run
            ),
            "raise max_restarts_per_run, or lower max_restarts",
        );
    }
}
