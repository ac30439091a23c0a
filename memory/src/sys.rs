//! The Linux syscall layer of the CPU backend: memfd creation, shared and anonymous mappings,
//! hole punching, prefaulting, and raw copies. Every `unsafe` block in the CPU backend lives here.
//!
//! Facts this layer is built on (measured on the project machine, see ARCH-NOTES.md):
//! - `fallocate(PUNCH_HOLE|KEEP_SIZE)` on the memfd returns pages to the OS and keeps the file
//!   size, so every mapping of it stays valid and reads zero; `MADV_DONTNEED` would free nothing.
//! - `pwrite` into a hole of a shmem file allocates pages without zeroing them first, which makes
//!   it the fastest way to bring a paused region back (about 2x faster than faulting pages in
//!   through the mapping, which zeroes each page and then copies).
//! - A read fault on a shared memfd mapping maps up to 16 neighbouring pages writable
//!   (fault-around), so touching one byte per page after `pwrite` maps the region cheaply.

use std::ffi::CStr;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::OnceLock;

use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fallocate, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

use crate::error::{MemoryError, Result};

/// Page size of the machine.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

/// Rounds `len` up to a whole number of pages.
pub(crate) fn round_to_pages(len: usize) -> Result<usize> {
    let p = page_size();
    len.checked_add(p - 1)
        .map(|n| n / p * p)
        .ok_or_else(|| MemoryError::InvalidArgument(format!("size {len} bytes overflows")))
}

/// Creates a close-on-exec memfd of `len` bytes whose size is sealed (no other process can
/// shrink it under our mapping, which would turn accesses into SIGBUS).
pub(crate) fn create_memfd(name: &CStr, len: usize) -> Result<OwnedFd> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(|e| MemoryError::errno("memfd_create", e))?;
    let len_off = i64::try_from(len)
        .map_err(|_| MemoryError::InvalidArgument(format!("size {len} bytes overflows")))?;
    nix::unistd::ftruncate(&fd, len_off).map_err(|e| MemoryError::errno("ftruncate(memfd)", e))?;
    let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(|e| MemoryError::errno("F_ADD_SEALS", e))?;
    Ok(fd)
}

/// Size of the file behind `fd` and the bytes it has allocated (`st_blocks * 512`).
pub(crate) fn file_size_and_allocated(fd: BorrowedFd<'_>) -> Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| MemoryError::errno("fstat", e))?;
    Ok((st.st_size.max(0) as u64, st.st_blocks.max(0) as u64 * 512))
}

/// Returns the pages of `range` of the file to the OS; the size and every mapping stay.
pub(crate) fn punch_hole(fd: BorrowedFd<'_>, range: Range<usize>) -> Result<()> {
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    fallocate(fd, flags, range.start as i64, range.len() as i64)
        .map_err(|e| MemoryError::errno("fallocate(PUNCH_HOLE)", e))
}

/// Allocates (zeroed) pages for `range` of the file now, so a later touch cannot SIGBUS.
pub(crate) fn allocate(fd: BorrowedFd<'_>, range: Range<usize>) -> Result<()> {
    fallocate(
        fd,
        FallocateFlags::empty(),
        range.start as i64,
        range.len() as i64,
    )
    .map_err(|e| MemoryError::errno("fallocate(allocate)", e))
}

/// Writes all of `src` to the file at offset `at`.
pub(crate) fn pwrite_all(fd: BorrowedFd<'_>, src: &[u8], at: usize) -> Result<()> {
    let mut off = 0usize;
    while off < src.len() {
        match nix::sys::uio::pwrite(fd, &src[off..], (at + off) as i64) {
            Ok(0) => return Err(MemoryError::InvalidArgument("pwrite wrote 0 bytes".into())),
            Ok(n) => off += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(MemoryError::errno("pwrite(memfd)", e)),
        }
    }
    Ok(())
}

/// Whether shmem (memfd) mappings that ask for huge pages get them: the kernel's
/// `shmem_enabled` setting for 2 MiB pages is `always`, `within_size`, `advise` or `force`.
/// Read once per process.
pub(crate) fn shmem_thp_setting() -> &'static str {
    static SETTING: OnceLock<String> = OnceLock::new();
    SETTING.get_or_init(|| {
        let read = |p: &str| {
            let text = std::fs::read_to_string(p).ok()?;
            let start = text.find('[')? + 1;
            let end = start + text[start..].find(']')?;
            Some(text[start..end].to_string())
        };
        const BASE: &str = "/sys/kernel/mm/transparent_hugepage";
        match read(&format!("{BASE}/hugepages-2048kB/shmem_enabled")).as_deref() {
            Some("inherit") | None => read(&format!("{BASE}/shmem_enabled")),
            Some(s) => Some(s.to_string()),
        }
        .unwrap_or_else(|| "unknown".to_string())
    })
}

/// See [`shmem_thp_setting`].
pub(crate) fn shmem_thp_enabled() -> bool {
    matches!(
        shmem_thp_setting(),
        "always" | "within_size" | "advise" | "force"
    )
}

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

/// Duplicates an fd as a new close-on-exec owned fd.
pub(crate) fn dup_fd(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned().map_err(|e| MemoryError::Sys {
        op: "dup",
        source: e,
    })
}

/// Checks that `fd` is a file of at least `len` bytes (a memfd normally).
pub(crate) fn check_fd_len(fd: &impl AsFd, len: usize) -> Result<()> {
    let (size, _) = file_size_and_allocated(fd.as_fd())?;
    if (size as usize) < len {
        return Err(MemoryError::InvalidArgument(format!(
            "fd {} is {size} bytes but {len} bytes were requested; pass the region's own length",
            fd.as_fd().as_raw_fd()
        )));
    }
    Ok(())
}
