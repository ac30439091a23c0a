//! Readings from `/proc`: process RSS (with its anonymous / file / shared-memory parts) and
//! system-wide `Shmem`, `MemTotal`, `MemAvailable`. Used by tests, the ledger and the bench.

use crate::error::{MemoryError, Result};

/// The parts of this process's resident set (`/proc/self/status`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RssBreakdown {
    /// `VmRSS`: everything.
    pub total: u64,
    /// `RssAnon`: private anonymous memory (CPU backups and snapshots live here).
    pub anon: u64,
    /// `RssFile`: file mappings.
    pub file: u64,
    /// `RssShmem`: shared memory (memfd regions live here).
    pub shmem: u64,
}

/// `VmRSS` of this process in bytes.
pub fn process_rss_bytes() -> Result<u64> {
    Ok(process_rss()?.total)
}

/// This process's RSS and its parts.
pub fn process_rss() -> Result<RssBreakdown> {
    const PATH: &str = "/proc/self/status";
    let text = read(PATH, "VmRSS")?;
    Ok(RssBreakdown {
        total: field_kb(&text, PATH, "VmRSS")?,
        anon: field_kb(&text, PATH, "RssAnon")?,
        file: field_kb(&text, PATH, "RssFile")?,
        shmem: field_kb(&text, PATH, "RssShmem")?,
    })
}

/// System-wide shared memory (`Shmem` in `/proc/meminfo`) in bytes.
pub fn system_shmem_bytes() -> Result<u64> {
    meminfo_bytes("Shmem")
}

/// `MemAvailable` in bytes.
pub fn mem_available_bytes() -> Result<u64> {
    meminfo_bytes("MemAvailable")
}

/// `ShmemPmdMapped` of this process's mapping that starts at `addr` (`/proc/self/smaps`): the
/// bytes of it mapped with 2 MiB shmem pages (for `tandem bench memory`).
#[cfg(any(test, feature = "bench"))]
pub fn shmem_huge_mapped_bytes(addr: usize) -> Result<u64> {
    const PATH: &str = "/proc/self/smaps";
    const FIELD: &str = "ShmemPmdMapped";
    let text = read(PATH, FIELD)?;
    let start = format!("{addr:x}-");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&start));
    let header = lines.next().ok_or_else(|| MemoryError::Proc {
        path: PATH,
        field: FIELD,
        reason: format!("no mapping starts at {addr:#x}"),
    })?;
    // Fields run until the next mapping's header line (`start-end perms ...`).
    let block: String = lines
        .take_while(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.ends_with(':'))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    field_kb(&block, PATH, FIELD).map_err(|e| MemoryError::Proc {
        path: PATH,
        field: FIELD,
        reason: format!("{e} (mapping `{header}`)"),
    })
}

/// One `kB` field of `/proc/meminfo`, in bytes.
pub(crate) fn meminfo_bytes(field: &'static str) -> Result<u64> {
    const PATH: &str = "/proc/meminfo";
    field_kb(&read(PATH, field)?, PATH, field)
}

fn read(path: &'static str, field: &'static str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| MemoryError::Proc {
        path,
        field,
        reason: e.to_string(),
    })
}

fn field_kb(text: &str, path: &'static str, field: &'static str) -> Result<u64> {
    let line = text
        .lines()
        .find(|l| l.split(':').next() == Some(field))
        .ok_or_else(|| MemoryError::Proc {
            path,
            field,
            reason: "field missing".into(),
        })?;
    let num = line.split_whitespace().nth(1).unwrap_or("");
    let kb: u64 = num.parse().map_err(|_| MemoryError::Proc {
        path,
        field,
        reason: format!("cannot parse `{line}`"),
    })?;
    Ok(kb * 1024)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_kb_fields_exactly() {
        let t = "Shmem:      8788 kB\nShmemHugePages:   2 kB\n";
        assert_eq!(field_kb(t, "x", "Shmem").unwrap(), 8788 * 1024);
        assert!(
            field_kb(t, "x", "Missing")
                .unwrap_err()
                .to_string()
                .contains("field missing")
        );
    }

    #[test]
    fn reads_this_machine() {
        let r = process_rss().unwrap();
        assert!(r.total > 0 && r.total >= r.anon);
        assert!(system_shmem_bytes().is_ok());
    }

    #[test]
    fn finds_the_huge_page_figure_of_one_mapping() {
        use std::os::fd::AsFd;
        let len = 4 << 20;
        let fd = crate::sys::create_memfd(c"stats-test", len).unwrap();
        let map = crate::sys::Mapping::shared(fd.as_fd(), len).unwrap();
        map.populate_write(0..len).unwrap();
        let huge = shmem_huge_mapped_bytes(map.ptr() as usize).unwrap();
        assert!(huge <= len as u64 && huge.is_multiple_of(2 << 20), "{huge}");
        if !crate::sys::shmem_thp_enabled() {
            assert_eq!(huge, 0);
        }
        let e = shmem_huge_mapped_bytes(1).unwrap_err().to_string();
        assert!(e.contains("no mapping starts at 0x1"), "{e}");
    }
}
