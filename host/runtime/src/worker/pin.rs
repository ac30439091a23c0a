//! Pinning a worker to CPU cores (`[placement.cpus]`): every thread of the process, and so
//! every thread and child process it starts afterwards (thread pools size themselves from the
//! cores they may use; Python servers and torchrun inherit the mask).

use crate::error::RuntimeError;
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<u32> {
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .filter_map(|c| u32::try_from(c).ok())
        .collect()
}

/// Restricts every thread of this process to `cpus` (nothing for an empty list).
pub fn pin_process(cpus: &[u32]) -> Result<(), RuntimeError> {
    if cpus.is_empty() {
        return Ok(());
    }
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c as usize).map_err(|e| {
            RuntimeError::usage(format!("CPU {c} cannot be pinned: {e}"))
                .with_help("name CPUs this machine has in [placement.cpus]")
        })?;
    }
    let tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for tid in tids.into_iter().chain([0]) {
        // A thread that exited since the listing is gone: nothing to pin.
        if let Err(e) = sched_setaffinity(Pid::from_raw(tid), &set)
            && e != nix::errno::Errno::ESRCH
        {
            return Err(
                RuntimeError::usage(format!("pinning to CPUs {cpus:?}: {e}"))
                    .with_help("name CPUs this process may run on in [placement.cpus]"),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_to_the_cpus_allowed_keeps_them_allowed() {
        let before = allowed_cpus();
        assert!(!before.is_empty());
        pin_process(&before).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(allowed_cpus(), before);
        assert!(pin_process(&[]).is_ok());
    }
}
