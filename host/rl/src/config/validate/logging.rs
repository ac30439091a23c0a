//! `[logging]`: what the trackers need before a run starts (an MLflow server address, a
//! Python that imports `wandb` for the W&B sidecar); unknown keys are refused by parsing.

use super::issues::Issues;
use crate::config::JobFile;

/// One line per problem of `[logging]`, at its key.
pub(super) fn check(issues: &mut Issues<'_>, job: &JobFile) {
    for (key, what, help) in job.logging.problems() {
        issues.at(&key, what, help);
    }
}
