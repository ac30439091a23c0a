//! Peak memory of the worker processes during a sync, measured without sampling.
//!
//! A sampler thread reading `/proc/<pid>/smaps_rollup` during the sync walked the page tables
//! of GB-sized workers under their mmap locks and took one of the two cores the sync itself
//! needed (a 26 MB LoRA sync on a 1 GB model: 16 ms alone, 23–46 ms with the sampler). The
//! kernel already keeps what we need: each process's RSS high-water mark (`VmHWM`), which
//! `clear_refs` value `5` resets to the current RSS in O(1). So [`PeakMeter`]:
//!
//! - before the sync (outside its clock): resets every worker's high-water mark and reads its
//!   proportional set size (`Pss`: a page shared by two processes counts half in each, so the
//!   weights an `ipc` engine maps from the trainer count once) and its RSS;
//! - after the sync: reads each worker's `VmHWM` from `/proc/<pid>/status` (O(1) counters).
//!
//! A worker that was there at the start contributes its starting Pss plus its growth
//! (`VmHWM` − starting RSS), less the shared memory it mapped and still maps at the end (pages
//! another worker owns, e.g. an engine touching the trainer's region, already counted there);
//! a worker started during the sync (a restarted engine) contributes its `VmHWM` less the
//! pages it shares at the end (RSS − Pss). The peak is the larger of that sum and the summed
//! Pss at the end. Summing per-process peaks that need not coincide makes this an upper bound
//! of the true peak of the sum, never an undercount of a transient copy.

/// What `/proc/<pid>/status` says of a process's resident memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Status {
    /// Resident set size (`VmRSS`).
    pub rss: u64,
    /// Its high-water mark since start or the last reset (`VmHWM`).
    pub hwm: u64,
    /// Resident shared memory (`RssShmem`: memfd regions, mapped or owned).
    pub shmem: u64,
    /// Resident anonymous memory (`RssAnon`: heap, stacks).
    pub anon: u64,
}

/// Parses the `kB` figures of a `/proc/<pid>/status` text.
fn parse_status(text: &str) -> Status {
    let kb = |key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |v| v * 1024)
    };
    Status {
        rss: kb("VmRSS:"),
        hwm: kb("VmHWM:"),
        shmem: kb("RssShmem:"),
        anon: kb("RssAnon:"),
    }
}

/// The resident-memory counters of one process (`None` once it is gone).
pub fn status(pid: u32) -> Option<Status> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse_status(&text))
}

/// The Pss of one process in bytes (`None` once it is gone).
pub fn pss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Pss:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The summed Pss of `pids` (processes that are gone count 0).
pub fn total_pss(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|&p| pss_bytes(p)).sum()
}

/// Resets the RSS high-water mark of `pid` to its current RSS; false if the kernel refused
/// (process gone, or `/proc` read-only), in which case `VmHWM` is the peak since it started.
pub fn reset_hwm(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), b"5").is_ok()
}

/// A worker present when the meter started.
#[derive(Debug)]
struct Start {
    pid: u32,
    pss: u64,
    status: Status,
}

/// Peak memory of a set of worker processes over one sync (see the module doc).
#[derive(Debug)]
pub struct PeakMeter {
    at_start: Vec<Start>,
    added: Vec<u32>,
}

impl PeakMeter {
    /// Resets the high-water marks of `pids` and reads their Pss and RSS (call it before the
    /// sync's clock starts: the Pss read walks page tables).
    pub fn start(pids: Vec<u32>) -> PeakMeter {
        let at_start = pids
            .into_iter()
            .filter_map(|pid| {
                reset_hwm(pid);
                let status = status(pid)?;
                let pss = pss_bytes(pid)?;
                Some(Start { pid, pss, status })
            })
            .collect();
        PeakMeter {
            at_start,
            added: Vec::new(),
        }
    }

    /// Adds a process started during the sync (e.g. a restarted engine).
    pub fn add(&mut self, pid: u32) {
        self.added.push(pid);
    }

    /// The peak summed memory of the workers during the sync, in bytes.
    pub fn finish(self) -> u64 {
        let mut peaks = 0u64;
        let mut end = 0u64;
        for s in &self.at_start {
            let (Some(now), Some(pss)) = (status(s.pid), pss_bytes(s.pid)) else {
                // Gone (a replaced engine, stopped after its successor was healthy): it was
                // paused, so it held what it held at the start until it exited.
                peaks += s.pss;
                continue;
            };
            end += pss;
            let mapped = now.shmem.saturating_sub(s.status.shmem);
            let growth = now.hwm.saturating_sub(s.status.rss).saturating_sub(mapped);
            peaks += s.pss + growth;
        }
        for &pid in &self.added {
            if let (Some(now), Some(pss)) = (status(pid), pss_bytes(pid)) {
                end += pss;
                peaks += now.hwm.saturating_sub(now.rss.saturating_sub(pss));
            }
        }
        peaks.max(end)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_the_kb_figures_as_bytes() {
        let text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\n\
                    RssShmem:\t   256 kB\n";
        assert_eq!(
            parse_status(text),
            Status {
                rss: 1024 * 1024,
                hwm: 2048 * 1024,
                shmem: 256 * 1024,
                anon: 512 * 1024,
            }
        );
        assert_eq!(parse_status("Name:\tx\n"), Status::default());
    }

    #[test]
    fn a_transient_allocation_is_seen_after_it_is_freed() {
        let me = std::process::id();
        let meter = PeakMeter::start(vec![me]);
        let before = total_pss(&[me]);
        {
            // 64 MiB touched page by page, then freed (glibc returns it with munmap).
            let mut v = vec![0u8; 64 << 20];
            for i in (0..v.len()).step_by(4096) {
                v[i] = 1;
            }
            std::hint::black_box(&mut v);
        }
        let peak = meter.finish();
        assert!(
            peak >= before + (60 << 20),
            "peak {peak} should include the freed 64 MiB above {before}"
        );
    }
}
