//! `[transport]` (a transport plan for the placement's groups, the peer timeout) and
//! `[memory]`.

use super::issues::Issues;
use crate::config::JobFile;

/// The transport chosen per group (empty when the devices are unknown or no plan fits),
/// then the timeout and the memory capacity.
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile, devices_ok: bool) -> Vec<String> {
    let groups = if devices_ok {
        plan(issues, j)
    } else {
        Vec::new()
    };
    let t = j.transport.timeout_secs;
    if !(t > 0.0 && t.is_finite()) {
        issues.at(
            "transport.timeout_secs",
            format!("must be > 0 (seconds), got {t}"),
            "seconds before a silent peer is declared dead, e.g. 60",
        );
    }
    if j.memory.cpu_capacity_bytes == Some(0) {
        issues.at(
            "memory.cpu_capacity_bytes",
            "must be at least 1",
            "remove it to use the machine's MemTotal",
        );
    }
    groups
}

/// One line per group (`trainers [0, 1]: shm (1 pair)`), or the problem at `backend`.
fn plan(issues: &mut Issues<'_>, j: &JobFile) -> Vec<String> {
    match crate::placement::Layout::of(j)
        .and_then(|layout| layout.transport_plan(&j.transport.backend))
    {
        Ok(groups) => groups.iter().map(ToString::to_string).collect(),
        Err(message) => {
            issues.at(
                "transport.backend",
                message,
                "use auto, shm, tcp or nccl; nccl needs CUDA and distinct GPUs",
            );
            Vec::new()
        }
    }
}
