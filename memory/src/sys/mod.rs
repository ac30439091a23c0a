//! The Linux syscall layer of the CPU backend: memfd creation, hole punching, `pwrite` and
//! descriptor passing (`fd.rs`), shared and anonymous mappings, prefaulting and the raw copies
//! (`mapping.rs`), page size and the kernel's huge-page setting (here).
//!
//! Every syscall and every raw-pointer operation on a mapping of the CPU backend lives in this
//! module, each `unsafe` block with its `// SAFETY:` sentence. Outside it, `unsafe` appears
//! only where the safety argument is a lock or contract that only the caller holds:
//! - calls to this module's `unsafe fn`s (`copy`, `copy_range`, `Mapping::bytes`,
//!   `Mapping::read_at`/`write_at`): in `mover.rs`, `snapshot.rs` and `bench.rs` under the
//!   region's write lock, in `share.rs` under `MappedRegion`'s contract (no `&mut` into a
//!   peer's region; `as_slice` is an `unsafe fn` forbidding writes);
//! - `region.rs`: `RegionView`/`RegionViewMut` turn a region their borrow keeps locked and
//!   resident into a typed slice;
//! - a unit test of `mover.rs` viewing a test-owned mapping as `u64`s.
//!
//! The CUDA backend (`cuda/`, feature `cuda`) keeps its driver calls in `cuda/raw.rs`.
//!
//! Facts this layer is built on (measured on the project machine, see ARCH-NOTES.md):
//! - `fallocate(PUNCH_HOLE|KEEP_SIZE)` on the memfd returns pages to the OS and keeps the file
//!   size, so every mapping of it stays valid and reads zero; `MADV_DONTNEED` would free nothing.
//! - `pwrite` into a hole of a shmem file allocates pages without zeroing them first, which makes
//!   it the fastest way to bring a paused region back (about 2x faster than faulting pages in
//!   through the mapping, which zeroes each page and then copies).
//! - A read fault on a shared memfd mapping maps up to 16 neighbouring pages writable
//!   (fault-around), so touching one byte per page after `pwrite` maps the region cheaply.

mod fd;
mod mapping;

pub(crate) use fd::{
    allocate, check_fd_len, create_memfd, dup_fd, file_size_and_allocated, punch_hole, pwrite_all,
};
pub use fd::{recv_fds, send_fds};
pub(crate) use mapping::{Mapping, copy, copy_range};

use std::sync::OnceLock;

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
