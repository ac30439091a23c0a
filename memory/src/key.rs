//! Region keys: a text name for a region that another process of the same user can resolve
//! without a socket. Format: `memfd:<pid>:<fd>:<len>:<ino>` — the owner's pid, the memfd's
//! descriptor number in the owner, the region length, and the memfd's inode number.
//!
//! Resolving opens `/proc/<pid>/fd/<fd>` (which reopens the very memfd, the way the kernel allows
//! for processes of the same user) and maps it with [`MappedRegion::attach`]. The inode number
//! guards against a stale key: once the owner frees the region, its descriptor number may be
//! reused for another file, and that file would have another inode.

use std::fmt;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::str::FromStr;

use crate::error::{MemoryError, Result};
use crate::region::Region;
use crate::share::MappedRegion;

/// Where a region lives, as a key another process can resolve (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionKey {
    /// Owner's process id.
    pub pid: u32,
    /// The memfd's descriptor number in the owner.
    pub fd: i32,
    /// Region length in bytes.
    pub len: usize,
    /// Inode number of the memfd.
    pub ino: u64,
}

const FORMAT_HELP: &str = "expected `memfd:<pid>:<fd>:<len>:<ino>` as returned by the owner's \
                           alloc_region";

impl RegionKey {
    /// The key of a region owned by this process.
    pub fn of(region: &Region) -> Result<RegionKey> {
        use std::os::fd::AsRawFd;
        let fd = region.fd();
        let ino = nix::sys::stat::fstat(fd)
            .map_err(|e| MemoryError::errno("fstat(memfd)", e))?
            .st_ino;
        Ok(RegionKey {
            pid: std::process::id(),
            fd: fd.as_raw_fd(),
            len: region.len(),
            ino,
        })
    }

    /// Opens the owner's memfd through `/proc` and maps it into this process.
    pub fn attach(&self) -> Result<MappedRegion> {
        let fd = self.open()?;
        MappedRegion::attach(fd, self.len)
    }

    /// Opens the owner's memfd (read-write) and checks it is the keyed one.
    pub fn open(&self) -> Result<OwnedFd> {
        let path = format!("/proc/{}/fd/{}", self.pid, self.fd);
        let fail = |reason: String| MemoryError::Attach {
            key: self.to_string(),
            reason,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                fail(format!(
                    "cannot open {path}: {e} (the owner exited or freed the region, or runs as \
                     another user)"
                ))
            })?;
        let meta = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat {path}: {e}")))?;
        if meta.ino() != self.ino {
            return Err(fail(format!(
                "{path} is now another file (inode {} instead of {}): the owner freed the region",
                meta.ino(),
                self.ino
            )));
        }
        if (meta.len() as usize) < self.len {
            return Err(fail(format!(
                "{path} holds {} bytes, fewer than the key's {}",
                meta.len(),
                self.len
            )));
        }
        Ok(OwnedFd::from(file))
    }
}

impl fmt::Display for RegionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memfd:{}:{}:{}:{}",
            self.pid, self.fd, self.len, self.ino
        )
    }
}

impl FromStr for RegionKey {
    type Err = MemoryError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || MemoryError::Parse {
            what: "region key",
            value: s.to_string(),
            help: FORMAT_HELP.to_string(),
        };
        let rest = s.strip_prefix("memfd:").ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let [pid, fd, len, ino] = parts.as_slice() else {
            return Err(bad());
        };
        let key = RegionKey {
            pid: pid.parse().map_err(|_| bad())?,
            fd: fd.parse().map_err(|_| bad())?,
            len: len.parse().map_err(|_| bad())?,
            ino: ino.parse().map_err(|_| bad())?,
        };
        if key.fd < 0 || key.len == 0 {
            return Err(bad());
        }
        Ok(key)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_reject_garbage() {
        let k = RegionKey {
            pid: 42,
            fd: 7,
            len: 4096,
            ino: 99,
        };
        assert_eq!(k.to_string(), "memfd:42:7:4096:99");
        assert_eq!(k.to_string().parse::<RegionKey>().unwrap(), k);
        for bad in [
            "",
            "memfd:1:2:3",
            "shm:1:2:3:4",
            "memfd:1:-2:3:4",
            "memfd:1:2:0:4",
            "memfd:a:2:3:4",
            "memfd:1:2:3:4:5",
        ] {
            let e = bad.parse::<RegionKey>().unwrap_err().to_string();
            assert!(e.contains("invalid region key"), "{bad}: {e}");
            assert!(e.contains("memfd:<pid>:<fd>:<len>:<ino>"), "{e}");
        }
    }
}
