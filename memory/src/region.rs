//! One CPU region: a sealed memfd mapped shared at a fixed address, its residency state, and the
//! [`Region`] handle its owner holds, with typed views.
//!
//! Invariants:
//! - The mapping's address and length never change while the region lives (pause punches the
//!   file's pages out, it never unmaps).
//! - Contents move (pause, resume, snapshot, restore) only under the region's write lock; views
//!   hold the read lock, so a live view makes those operations fail with `Borrowed`.
//! - `paused == true` exactly when the file's pages were returned; `backup_live` is true exactly
//!   when a paused `cpu`-policy region's bytes sit in `backup`.

use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use crate::error::{MemoryError, Result};
use crate::ledger::RegionReport;
use crate::manager::Inner;
use crate::mover;
use crate::sys::{self, Mapping};
use crate::tag::{BackupPolicy, DType, RegionSpec, Tag};

/// Residency of one region; guarded by the region's lock.
#[derive(Debug, Default)]
pub(crate) struct Residency {
    pub(crate) paused: bool,
    /// Backup buffer, kept after resume (lazily freed) so the next pause reuses it.
    pub(crate) backup: Option<Mapping>,
    /// The backup holds the paused region's bytes.
    pub(crate) backup_live: bool,
}

/// The shared part of a region (owned by the manager and the handle).
#[derive(Debug)]
pub(crate) struct RegionCell {
    pub(crate) id: u64,
    pub(crate) spec: RegionSpec,
    pub(crate) fd: OwnedFd,
    pub(crate) map: Mapping,
    pub(crate) state: RwLock<Residency>,
}

impl RegionCell {
    pub(crate) fn new(id: u64, spec: RegionSpec) -> Result<RegionCell> {
        spec.validate()?;
        let len = sys::round_to_pages(spec.size)?;
        let name = std::ffi::CString::new(format!("tandem-{}-{id}", spec.tag))
            .map_err(|_| MemoryError::InvalidArgument("tag contains NUL".into()))?;
        let fd = sys::create_memfd(&name, len)?;
        let map = Mapping::shared(fd.as_fd(), len)?;
        Ok(RegionCell {
            id,
            spec,
            fd,
            map,
            state: RwLock::new(Residency::default()),
        })
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Residency> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exclusive access for moving contents, or `Borrowed` if a view is alive.
    pub(crate) fn lock_exclusive(&self) -> Result<RwLockWriteGuard<'_, Residency>> {
        match self.state.try_write() {
            Ok(g) => Ok(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(MemoryError::Borrowed {
                id: self.id,
                tag: self.spec.tag.to_string(),
            }),
        }
    }

    /// Copies out (per policy) and returns the pages to the OS, using up to `threads` threads.
    /// Caller holds the write lock.
    pub(crate) fn pause(&self, res: &mut Residency, threads: usize) -> Result<()> {
        if res.paused {
            return Err(MemoryError::AlreadyPaused {
                id: self.id,
                tag: self.spec.tag.to_string(),
            });
        }
        let len = self.map.len();
        if self.spec.backup == BackupPolicy::Cpu && res.backup.is_none() {
            res.backup = Some(Mapping::anonymous(len)?);
        }
        let backup = match self.spec.backup {
            BackupPolicy::Cpu => res.backup.as_ref(),
            BackupPolicy::Discard => None,
        };
        // Raw-pointer users must not touch a region while it is being paused (documented on
        // `Region::as_ptr`); the write lock excludes views.
        mover::pause(&self.parts(backup), mover::How::with_threads(threads))?;
        res.paused = true;
        res.backup_live = self.spec.backup == BackupPolicy::Cpu;
        Ok(())
    }

    /// Brings the pages back at the same address, using up to `threads` threads. Caller holds
    /// the write lock.
    pub(crate) fn resume(&self, res: &mut Residency, threads: usize) -> Result<()> {
        if !res.paused {
            return Err(MemoryError::NotPaused {
                id: self.id,
                tag: self.spec.tag.to_string(),
            });
        }
        let backup = match (&res.backup, res.backup_live) {
            (Some(b), true) => Some(b),
            _ => None,
        };
        mover::resume(&self.parts(backup), mover::How::with_threads(threads))?;
        if let Some(b) = backup {
            b.lazy_free();
        }
        res.paused = false;
        res.backup_live = false;
        Ok(())
    }

    fn parts<'a>(&'a self, backup: Option<&'a Mapping>) -> mover::Parts<'a> {
        mover::Parts {
            map: &self.map,
            fd: self.fd.as_fd(),
            backup,
        }
    }

    pub(crate) fn allocated_bytes(&self) -> u64 {
        sys::file_size_and_allocated(self.fd.as_fd()).map_or(0, |(_, a)| a)
    }

    pub(crate) fn report(&self) -> RegionReport {
        let res = self.read();
        let size = self.spec.size as u64;
        RegionReport {
            id: self.id,
            tag: self.spec.tag.clone(),
            dtype: self.spec.dtype,
            backup_policy: self.spec.backup,
            size_bytes: size,
            paused: res.paused,
            resident_bytes: if res.paused { 0 } else { size },
            paused_bytes: if res.paused { size } else { 0 },
            backup_bytes: if res.backup_live { size } else { 0 },
            retained_backup_bytes: match (&res.backup, res.backup_live) {
                (Some(b), false) => b.len() as u64,
                _ => 0,
            },
            allocated_bytes: self.allocated_bytes(),
        }
    }
}

/// Element types a region can be viewed as (plain data: every bit pattern is valid).
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($t:ty),*) => { $(impl sealed::Sealed for $t {} impl Element for $t {})* };
}
elements!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// An owner's handle to a region. Dropping it frees the region (other processes that mapped the
/// fd keep their mapping of the memory).
#[derive(Debug)]
pub struct Region {
    pub(crate) cell: Arc<RegionCell>,
    pub(crate) owner: Weak<Inner>,
}

impl Region {
    /// Process-unique id of the region.
    pub fn id(&self) -> u64 {
        self.cell.id
    }
    /// Its tag.
    pub fn tag(&self) -> &Tag {
        &self.cell.spec.tag
    }
    /// Size in bytes as requested.
    pub fn len(&self) -> usize {
        self.cell.spec.size
    }
    /// Always false (regions have at least one byte); here for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.cell.spec.size == 0
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.cell.spec.dtype
    }
    /// Backup policy.
    pub fn backup_policy(&self) -> BackupPolicy {
        self.cell.spec.backup
    }
    /// The spec it was allocated with.
    pub fn spec(&self) -> &RegionSpec {
        &self.cell.spec
    }

    /// Start address; stable for the life of the region, across pause and resume.
    ///
    /// For FFI and compute kernels. The caller must not access the memory while the region is
    /// paused or being paused/resumed/restored (reads would see zeros or a torn copy, writes would
    /// be lost); use [`Region::view`] / [`Region::view_mut`] for checked access.
    pub fn as_ptr(&self) -> *mut u8 {
        self.cell.map.ptr()
    }

    /// The memfd backing the region (map it elsewhere with `MappedRegion::attach`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.cell.fd.as_fd()
    }

    /// A new close-on-exec descriptor for the memfd, e.g. to keep after the handle is gone.
    pub fn try_clone_fd(&self) -> Result<OwnedFd> {
        sys::dup_fd(self.cell.fd.as_fd())
    }

    /// Whether the region is paused now.
    pub fn is_paused(&self) -> bool {
        self.cell.read().paused
    }

    /// Bytes of physical memory the memfd holds now (`st_blocks * 512`): ~0 when paused.
    pub fn allocated_bytes(&self) -> u64 {
        self.cell.allocated_bytes()
    }

    /// Shared typed view. While it lives the region cannot be paused, resumed, snapshotted or
    /// restored (those fail with `Borrowed`). Fails with `Paused` on a paused region.
    pub fn view<T: Element>(&self) -> Result<RegionView<'_, T>> {
        let (guard, n) = self.checked_view::<T>("viewing it")?;
        Ok(RegionView {
            _guard: guard,
            ptr: self.cell.map.ptr().cast(),
            n,
            _t: PhantomData,
        })
    }

    /// Exclusive typed view; same rules as [`Region::view`].
    pub fn view_mut<T: Element>(&mut self) -> Result<RegionViewMut<'_, T>> {
        let (guard, n) = self.checked_view::<T>("writing it")?;
        Ok(RegionViewMut {
            _guard: guard,
            ptr: self.cell.map.ptr().cast(),
            n,
            _t: PhantomData,
        })
    }

    fn checked_view<T: Element>(
        &self,
        action: &'static str,
    ) -> Result<(RwLockReadGuard<'_, Residency>, usize)> {
        let elem = std::mem::size_of::<T>();
        let dtype = self.cell.spec.dtype;
        if elem != 1 && elem != dtype.size_bytes() {
            return Err(MemoryError::InvalidArgument(format!(
                "region {} (tag `{}`) holds {dtype} ({} bytes) and cannot be viewed as a \
                 {elem}-byte type; view it as u8 or as a {}-byte element",
                self.id(),
                self.tag(),
                dtype.size_bytes(),
                dtype.size_bytes()
            )));
        }
        let guard = self.cell.read();
        if guard.paused {
            return Err(MemoryError::Paused {
                id: self.id(),
                tag: self.tag().to_string(),
                action,
            });
        }
        Ok((guard, self.len() / elem))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(inner) = self.owner.upgrade() {
            inner.forget(self.cell.id);
        }
    }
}

/// A shared view of a resident region as `&[T]`.
pub struct RegionView<'a, T> {
    _guard: RwLockReadGuard<'a, Residency>,
    ptr: *const T,
    n: usize,
    _t: PhantomData<&'a [T]>,
}

impl<T: Element> std::ops::Deref for RegionView<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping is page-aligned (so aligned for T), holds n elements of plain data,
        // stays mapped while the borrowed Region lives, and the read lock keeps it resident and
        // excludes writers in this process.
        unsafe { std::slice::from_raw_parts(self.ptr, self.n) }
    }
}

/// An exclusive view of a resident region as `&mut [T]`.
pub struct RegionViewMut<'a, T> {
    _guard: RwLockReadGuard<'a, Residency>,
    ptr: *mut T,
    n: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<T: Element> std::ops::Deref for RegionViewMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: as for RegionView; we borrow the Region mutably, so no other view exists.
        unsafe { std::slice::from_raw_parts(self.ptr, self.n) }
    }
}

impl<T: Element> std::ops::DerefMut for RegionViewMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for Deref; the &mut Region borrow makes this the only view in the process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.n) }
    }
}

impl<T> std::fmt::Debug for RegionView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionView")
            .field("elements", &self.n)
            .finish()
    }
}

impl<T> std::fmt::Debug for RegionViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionViewMut")
            .field("elements", &self.n)
            .finish()
    }
}
