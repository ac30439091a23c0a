//! `[task]`: the task is built the way the run builds it; its error names the key.

use super::issues::Issues;
use crate::config::JobFile;

/// Builds the job's task; a problem goes to its key (`task.kind`, `task.options.KEY`).
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile) {
    let Err(e) = crate::task::build(&j.task, j.run.seed) else {
        return;
    };
    let help = e
        .help
        .unwrap_or_else(|| format!("built-in tasks: {}", crate::task::KINDS.join(", ")));
    issues.at(&format!("task.{}", e.key), e.message, help);
}
