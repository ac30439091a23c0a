//! Mappings: an owned shared or anonymous mapping ([`Mapping`]) with its paging advice,
//! prefaulting and lazy freeing, and the raw copies between mappings and buffers.

use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use super::page_size;
use crate::error::{MemoryError, Result};

/// An owned mapping; unmapped on drop. Its address never changes while it lives.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an exclusive owner of an address range (like Box<[u8]>); access to the
// bytes is synchronised by its users (the region lock in `region.rs`).
unsafe impl Send for Mapping {}
// SAFETY: &Mapping only hands out the raw pointer; see the Send impl.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-write, asking for huge pages (honoured only where
    /// the kernel's shmem THP setting allows it, see [`shmem_thp_enabled`]).
    pub(crate) fn shared(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping> {
        let m = Self::map(len, libc::MAP_SHARED, fd.as_raw_fd(), "mmap(MAP_SHARED)")?;
        m.advise(0..len, libc::MADV_HUGEPAGE);
        Ok(m)
    }

    /// Maps `len` bytes of private anonymous memory, asking for transparent huge pages (first
    /// touch of 2 MiB pages is ~10x cheaper than of 4 KiB pages on the project machine).
    pub(crate) fn anonymous(len: usize) -> Result<Mapping> {
        let m = Self::map(
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            "mmap(anonymous)",
        )?;
        m.advise(0..len, libc::MADV_HUGEPAGE);
        Ok(m)
    }

    /// `madvise` for a policy-only advice (huge pages); failure is harmless and ignored.
    fn advise(&self, range: Range<usize>, advice: i32) {
        if range.end > self.len || range.is_empty() {
            return;
        }
        // SAFETY: the range lies inside our live mapping; the advice only changes paging policy
        // and never invalidates contents.
        let _ = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(range.start).cast(),
                range.len(),
                advice,
            )
        };
    }

    /// Faults `range` in writable now (allocating zeroed pages of a shared file where it has
    /// holes), without touching the bytes from user space.
    pub(crate) fn populate_write(&self, range: Range<usize>) -> Result<()> {
        if range.end > self.len {
            return Err(MemoryError::InvalidArgument(format!(
                "populate range {range:?} is outside the {}-byte mapping",
                self.len
            )));
        }
        // SAFETY: the range lies inside our live mapping; MADV_POPULATE_WRITE only faults pages
        // in (as a write of unchanged bytes would) and never changes contents.
        let r = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(range.start).cast(),
                range.len(),
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            return Err(MemoryError::last_os("madvise(MADV_POPULATE_WRITE)"));
        }
        Ok(())
    }

    fn map(len: usize, flags: i32, fd: i32, op: &'static str) -> Result<Mapping> {
        if len == 0 {
            return Err(MemoryError::InvalidArgument(format!("{op}: zero length")));
        }
        // SAFETY: we pass a null hint, a non-zero length and a valid fd (or -1 for anonymous
        // memory); the kernel picks a fresh range that aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(MemoryError::last_os(op));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| MemoryError::last_os(op))?;
        Ok(Mapping { ptr, len })
    }

    /// Start address.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads one byte per page of `range` so every page is mapped (fault-around maps neighbours
    /// too).
    pub(crate) fn touch_read(&self, range: Range<usize>) {
        let step = page_size();
        let mut off = range.start;
        let end = range.end.min(self.len);
        let mut acc = 0u8;
        while off < end {
            // SAFETY: off < len, so the address is inside our live mapping.
            acc ^= unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(off)) };
            off += step;
        }
        std::hint::black_box(acc);
    }

    /// Tells the kernel it may reclaim these anonymous pages lazily; their contents become
    /// undefined but the range stays mapped and reusable without new page faults if not reclaimed.
    pub(crate) fn lazy_free(&self) {
        // SAFETY: the range is exactly our private anonymous mapping; nobody holds references to
        // its bytes (callers only do this to an unused backup buffer). Failure is harmless.
        let _ = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_FREE) };
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping (a range past the end is
    /// clamped away in release builds and caught in debug ones). A concurrent writer in another
    /// process may tear the copy; bytes have no invalid values, so that is never undefined.
    ///
    /// # Safety
    /// No `&mut` into the range may live in this process during the copy.
    pub(crate) unsafe fn read_at(&self, offset: usize, buf: &mut [u8]) {
        let n = self.in_bounds(offset, buf.len());
        if n == 0 {
            return;
        }
        // SAFETY: `offset + n` is inside our live mapping (clamped above, n > 0) and `buf` is a
        // distinct Rust allocation; a concurrent writer can only change byte values, and the
        // caller guarantees no `&mut` aliases the range.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), buf.as_mut_ptr(), n) }
    }

    /// Copies `data` into the mapping at `offset` (clamped like [`Mapping::read_at`]).
    ///
    /// # Safety
    /// No Rust reference into the range may live in this process during the copy.
    pub(crate) unsafe fn write_at(&self, offset: usize, data: &[u8]) {
        let n = self.in_bounds(offset, data.len());
        if n == 0 {
            return;
        }
        // SAFETY: `offset + n` is inside our live mapping (clamped above, n > 0) and `data` is a
        // distinct Rust allocation; the caller guarantees no reference aliases the range.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), n) }
    }

    /// How many of the `n` bytes at `offset` lie inside the mapping: all of them, since a
    /// range past the end is the caller's bug (caught in debug builds, clamped away in release
    /// ones).
    fn in_bounds(&self, offset: usize, n: usize) -> usize {
        debug_assert!(offset.checked_add(n).is_some_and(|end| end <= self.len));
        n.min(self.len.saturating_sub(offset))
    }

    /// The bytes, read-only.
    ///
    /// # Safety
    /// No one may write the range for the lifetime of the returned slice (in this process or,
    /// for a shared mapping, in another one).
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: ptr/len describe our live mapping; the caller guarantees no concurrent writes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this range and nothing borrows it once the Mapping is dropped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Copies `len` bytes from `src` to `dst` (the two mappings must not overlap and both must be at
/// least `len` long).
///
/// # Safety
/// Nobody may access `dst`'s first `len` bytes or write `src`'s during the copy.
pub(crate) unsafe fn copy(dst: &Mapping, src: &Mapping, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { copy_range(dst, src, 0..len) }
}

/// Copies bytes `range` of `src` to the same offsets of `dst` (distinct mappings; a range past
/// either end is clamped away in release builds and caught in debug ones).
///
/// # Safety
/// Nobody may access `dst`'s `range` or write `src`'s `range` during the copy.
pub(crate) unsafe fn copy_range(dst: &Mapping, src: &Mapping, range: Range<usize>) {
    debug_assert!(range.end <= dst.len && range.end <= src.len);
    let end = range.end.min(dst.len).min(src.len);
    if range.start >= end {
        return;
    }
    // SAFETY: distinct mappings never overlap; the range is inside both (clamped above); the
    // caller guarantees exclusivity.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.ptr.as_ptr().add(range.start),
            dst.ptr.as_ptr().add(range.start),
            end - range.start,
        )
    }
}
