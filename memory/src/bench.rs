//! What `tandem bench memory` (crate `tandem-bench`) needs from inside a region, behind the
//! `bench` feature: the limits it measures on a region's own memfd and warm backup buffer,
//! which only this crate can reach.
//!
//! - [`memcpy_limit`]: after one pause/resume cycle the region's backup buffer is warm, so the
//!   resident region is copied into it directly (best of two) - a plain memcpy between two
//!   faulted-in buffers of the region's size, with no extra memory.
//! - [`kernel_rates`]: the kernel's own rates on the region's memfd, each in one thread:
//!   `punch` (returning its pages: what every pause pays on top of the copy), `alloc` (faulting
//!   zeroed pages in through the mapping with `MADV_POPULATE_WRITE`: what a discard resume, and
//!   a backup resume with shmem huge pages, pays before copying) and `pwrite` (`pwrite` into a
//!   hole: page allocation without zeroing, what a backup resume pays with 4 KiB shmem pages).
//! - [`shmem_huge_mapped_bytes`] and [`shmem_thp_setting`]: how much of a region the kernel
//!   mapped with 2 MiB pages, and the `shmem_enabled` setting that decides it.

use std::os::fd::AsFd;
use std::time::Instant;

use crate::Region;
use crate::error::{MemoryError, Result};
use crate::{stats, sys};

/// The kernel's own rates on a region's memfd, in GB/s (one thread each).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelRates {
    /// Hole punching (what every pause pays on top of the copy).
    pub punch: f64,
    /// Zeroed page allocation through the mapping (`MADV_POPULATE_WRITE`).
    pub alloc: f64,
    /// `pwrite` into a hole: page allocation without zeroing.
    pub pwrite: f64,
}

fn gbs(size: usize, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(size as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9)
}

/// Measures [`KernelRates`] on a resident region that has been paused once (its contents are
/// garbage afterwards, and it is left resident).
pub fn kernel_rates(region: &Region) -> Result<KernelRates> {
    let cell = &region.cell;
    let res = cell.lock_exclusive()?;
    let fd = cell.fd.as_fd();
    let len = cell.map.len();
    let backup = res.backup.as_ref().ok_or_else(|| {
        MemoryError::InvalidArgument("bench: no backup buffer after a pause".into())
    })?;
    let punch = gbs(len, || sys::punch_hole(fd, 0..len))?;
    let alloc = gbs(len, || cell.map.populate_write(0..len))?;
    sys::punch_hole(fd, 0..len)?;
    // SAFETY: we hold the region's write lock; only this region writes its (retained) backup.
    let src = unsafe { backup.bytes() };
    let pwrite = gbs(len, || sys::pwrite_all(fd, &src[..len], 0))?;
    cell.map.touch_read(0..len);
    backup.lazy_free();
    Ok(KernelRates {
        punch,
        alloc,
        pwrite,
    })
}

/// Best of two copies of a resident region (paused once) into its warm (retained) backup
/// buffer, in GB/s.
pub fn memcpy_limit(region: &Region) -> Result<f64> {
    let cell = &region.cell;
    let res = cell.lock_exclusive()?;
    let backup = res.backup.as_ref().ok_or_else(|| {
        MemoryError::InvalidArgument("bench: no backup buffer after a pause".into())
    })?;
    let len = cell.map.len();
    let mut best = 0f64;
    for _ in 0..2 {
        // SAFETY: we hold the region's write lock; the retained backup is not live (resumed), so
        // overwriting it loses nothing.
        best = best.max(gbs(len, || {
            unsafe { sys::copy(backup, &cell.map, len) };
            Ok(())
        })?);
    }
    backup.lazy_free();
    Ok(best)
}

/// Bytes of a region the kernel mapped with 2 MiB shmem pages (`ShmemPmdMapped`).
pub fn shmem_huge_mapped_bytes(region: &Region) -> Result<u64> {
    stats::shmem_huge_mapped_bytes(region.as_ptr() as usize)
}

/// The kernel's `shmem_enabled` setting for 2 MiB pages (`always`, `within_size`, `advise`,
/// `never`, ...).
pub fn shmem_thp_setting() -> &'static str {
    sys::shmem_thp_setting()
}
