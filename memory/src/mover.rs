//! Moving a region's bytes across a pause: out to the backup and back to the kernel (pause), and
//! from the kernel and the backup into the region (resume), in chunks worked on by two threads at
//! once for large regions.
//!
//! Why two threads: with 4 KiB shmem pages the kernel's per-page work (returning a page on
//! punch, allocating one on `pwrite`, mapping it) costs more than copying it, and it runs in the
//! calling thread. A pipeline overlaps them: one thread copies (or writes) chunk k while the
//! other hands chunk k-1 to the kernel (punch) or maps it. The file's hole-punch and `pwrite`
//! take the inode lock, so only one of the two threads calls them.
//!
//! The path depends on the kernel's shmem huge-page setting ([`sys::shmem_thp_enabled`]):
//! - 4 KiB shmem pages: resume `pwrite`s the backup (shmem allocates pages a write fills without
//!   zeroing them, the cheapest way in), then populates the mapping. Both directions pipelined.
//! - Huge shmem pages: punching is ~free (one folio per 2 MiB) and `pwrite` would allocate
//!   4 KiB pages (it has no mapping to ask for huge ones), so resume faults 2 MiB pages in
//!   through the mapping (`MADV_POPULATE_WRITE`) and copies the backup into them. One thread
//!   both ways: a helper thread measured slower here (the zeroing and the copy compete for the
//!   same memory bandwidth, and the machine's second core is rarely idle).

use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::sync::mpsc;

use crate::error::{MemoryError, Result};
use crate::sys::{self, Mapping};

/// Chunk size of the pipeline.
const CHUNK: usize = 16 << 20;

/// Regions below this size move in one thread (spawning costs more than it saves).
pub(crate) const PARALLEL_MIN: usize = 32 << 20;

/// Where one region's bytes live: its mapping and memfd, and its backup buffer if it has one.
pub(crate) struct Parts<'a> {
    pub(crate) map: &'a Mapping,
    pub(crate) fd: BorrowedFd<'a>,
    pub(crate) backup: Option<&'a Mapping>,
}

/// How to move: threads allowed, and whether shmem huge pages are on
/// ([`sys::shmem_thp_enabled`]; a parameter so tests can drive both paths).
#[derive(Debug, Clone, Copy)]
pub(crate) struct How {
    pub(crate) threads: usize,
    pub(crate) huge: bool,
}

impl How {
    /// `threads` threads, huge pages as the kernel is set up.
    pub(crate) fn with_threads(threads: usize) -> How {
        How {
            threads,
            huge: sys::shmem_thp_enabled(),
        }
    }
}

/// Pause: copy the region into its backup (if any), then return its pages to the OS.
///
/// The caller holds the region's write lock (nobody in this process reads or writes it).
pub(crate) fn pause(p: &Parts<'_>, how: How) -> Result<()> {
    let len = p.map.len();
    let copy = |r: Range<usize>| {
        if let Some(b) = p.backup {
            // SAFETY: the caller holds the region's write lock and the backup is the region's
            // own; each chunk is copied by one thread only.
            unsafe { sys::copy_range(b, p.map, r) };
        }
        Ok(())
    };
    let punch = |r: Range<usize>| sys::punch_hole(p.fd, r);
    // With huge shmem pages the punch is nearly free, so a helper would only compete with the
    // copy for the CPU.
    if p.backup.is_none() || how.threads < 2 || len < PARALLEL_MIN || how.huge {
        copy(0..len)?;
        return punch(0..len);
    }
    pipeline(len, copy, punch)
}

/// Resume: bring the pages back with the backup's bytes (or zeroed without a backup) and map
/// them. The caller holds the region's write lock.
pub(crate) fn resume(p: &Parts<'_>, how: How) -> Result<()> {
    let len = p.map.len();
    let parallel = how.threads >= 2 && len >= PARALLEL_MIN;
    match (p.backup, how.huge) {
        (Some(b), false) => {
            let write = |r: Range<usize>| {
                // SAFETY: only this region writes its backup, and the caller holds its lock.
                let src = unsafe { &b.bytes()[r.clone()] };
                sys::pwrite_all(p.fd, src, r.start)
            };
            let map = |r: Range<usize>| {
                p.map.touch_read(r);
                Ok(())
            };
            run(parallel, len, write, map)
        }
        (Some(b), true) => {
            // One thread: populate-ahead in a helper measured slower here than this (the
            // zeroing and the copy compete for the same memory bandwidth).
            p.map.populate_write(0..len)?;
            // SAFETY: the caller holds the region's write lock.
            unsafe { sys::copy_range(p.map, b, 0..len) };
            Ok(())
        }
        (None, false) => {
            sys::allocate(p.fd, 0..len)?;
            p.map.touch_read(0..len);
            Ok(())
        }
        (None, true) => p.map.populate_write(0..len),
    }
}

fn run(
    parallel: bool,
    len: usize,
    first: impl Fn(Range<usize>) -> Result<()>,
    then: impl Fn(Range<usize>) -> Result<()> + Sync,
) -> Result<()> {
    if parallel {
        pipeline(len, first, then)
    } else {
        first(0..len)?;
        then(0..len)
    }
}

/// Runs `first` over `[0, len)` chunk by chunk in this thread and `then` on each chunk in a
/// helper thread as soon as `first` is done with it. Stops at the first error of either.
fn pipeline(
    len: usize,
    first: impl Fn(Range<usize>) -> Result<()>,
    then: impl Fn(Range<usize>) -> Result<()> + Sync,
) -> Result<()> {
    let (tx, rx) = mpsc::channel::<Range<usize>>();
    std::thread::scope(|s| {
        let helper = s.spawn(|| -> Result<()> {
            for r in rx {
                then(r)?;
            }
            Ok(())
        });
        let mut front = Ok(());
        let mut at = 0;
        while at < len {
            let r = at..(at + CHUNK).min(len);
            if let Err(e) = first(r.clone()) {
                front = Err(e);
                break;
            }
            at = r.end;
            if tx.send(r).is_err() {
                break; // the helper failed; its error is reported below
            }
        }
        drop(tx);
        let back = helper.join().unwrap_or_else(|_| {
            Err(MemoryError::InvalidArgument(
                "memory pipeline helper thread panicked".into(),
            ))
        });
        front.and(back)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::Mutex;

    fn word(i: usize) -> u64 {
        (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// Every path (one or two threads, 4 KiB or huge-page resume, with or without backup) gives
    /// the bytes back, frees the memfd's pages on pause, and leaves the address alone.
    #[test]
    fn every_path_round_trips_and_frees() {
        let len = PARALLEL_MIN + CHUNK + 4096; // pipelined, with a partial last chunk
        let fd = sys::create_memfd(c"mover-test", len).unwrap();
        let map = Mapping::shared(fd.as_fd(), len).unwrap();
        let backup = Mapping::anonymous(len).unwrap();
        let words = len / 8;
        // SAFETY: test-owned mapping of `words` u64s, used from this thread only, and each
        // slice is dropped before the next move.
        let region = || unsafe { std::slice::from_raw_parts_mut(map.ptr().cast::<u64>(), words) };
        for threads in [1, 2] {
            for huge in [false, true] {
                let how = How { threads, huge };
                for (i, w) in region().iter_mut().enumerate() {
                    *w = word(i + threads);
                }
                let with = Parts {
                    map: &map,
                    fd: fd.as_fd(),
                    backup: Some(&backup),
                };
                pause(&with, how).unwrap();
                let (_, allocated) = sys::file_size_and_allocated(fd.as_fd()).unwrap();
                assert_eq!(allocated, 0, "{how:?}");
                resume(&with, how).unwrap();
                assert!(
                    region()
                        .iter()
                        .enumerate()
                        .all(|(i, &w)| w == word(i + threads)),
                    "{how:?}"
                );
                let without = Parts {
                    map: &map,
                    fd: fd.as_fd(),
                    backup: None,
                };
                pause(&without, how).unwrap();
                resume(&without, how).unwrap();
                let (_, allocated) = sys::file_size_and_allocated(fd.as_fd()).unwrap();
                assert!(allocated >= len as u64, "{how:?}: pages claimed on resume");
                assert!(region().iter().all(|&w| w == 0), "{how:?}");
            }
        }
    }

    #[test]
    fn pipeline_visits_every_chunk_in_order_once() {
        let len = 3 * CHUNK + 5;
        let firsts = Mutex::new(Vec::new());
        let thens = Mutex::new(Vec::new());
        pipeline(
            len,
            |r| {
                firsts.lock().unwrap().push(r);
                Ok(())
            },
            |r| {
                thens.lock().unwrap().push(r);
                Ok(())
            },
        )
        .unwrap();
        let want = vec![
            0..CHUNK,
            CHUNK..2 * CHUNK,
            2 * CHUNK..3 * CHUNK,
            3 * CHUNK..len,
        ];
        assert_eq!(*firsts.lock().unwrap(), want);
        assert_eq!(*thens.lock().unwrap(), want);
    }

    #[test]
    fn pipeline_reports_an_error_of_either_stage() {
        let e = pipeline(
            4 * CHUNK,
            |_| Ok(()),
            |r| {
                if r.start == CHUNK {
                    Err(MemoryError::InvalidArgument("then failed".into()))
                } else {
                    Ok(())
                }
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("then failed"), "{e}");
        let e = pipeline(
            4 * CHUNK,
            |r| {
                if r.start == 2 * CHUNK {
                    Err(MemoryError::InvalidArgument("first failed".into()))
                } else {
                    Ok(())
                }
            },
            |_| Ok(()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("first failed"), "{e}");
    }
}
