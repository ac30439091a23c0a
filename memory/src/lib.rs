//! Tandem's memory layer: tagged regions that pause (free physical memory, keep the address)
//! and resume bit-exact, named snapshots, and one ledger per device.
//!
//! ```no_run
//! use tandem_memory::{ManagerConfig, MemoryManager, RegionSpec, Tag, DType};
//! # fn main() -> Result<(), tandem_memory::MemoryError> {
//! let mgr = MemoryManager::new(ManagerConfig::cpu("trainer-0"));
//! let mut w = mgr.alloc(RegionSpec::new(Tag::Weights, 1 << 20, DType::F32))?;
//! w.view_mut::<f32>()?.fill(1.0);
//! let addr = w.as_ptr();
//! mgr.pause(&[Tag::Weights])?;   // pages go back to the OS, copy kept on CPU
//! mgr.resume(&[Tag::Weights])?;  // same address, same bytes
//! assert_eq!(w.as_ptr(), addr);
//! # Ok(()) }
//! ```
//!
//! Codemap: `tag` (Tag, DType, BackupPolicy, RegionSpec), `region` (one memfd region and its
//! handle/views), `manager` (MemoryManager, pause/resume, guards, budget checks), `mover` (the
//! two-thread copy/punch/populate pipelines of pause and resume), `snapshot`,
//! `budget`, `ledger` (reports and DeviceLedger), `share` (MappedRegion, sending regions), `key` (RegionKey: share by `/proc` path), `stats`
//! (/proc readings), `bench` (feature `bench`: the limits `tandem bench memory` measures
//! inside a region), `sys` (all CPU syscalls and raw-pointer work, and
//! their `unsafe`; see its doc for the `unsafe` calls outside it), `cuda` (feature).

#[cfg(feature = "bench")]
pub mod bench;
mod budget;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod key;
mod ledger;
mod manager;
mod mover;
mod region;
mod share;
mod snapshot;
mod stats;
mod sys;
mod tag;

pub use budget::{Budget, SAFETY_MARGIN, check_fractions, cpu_capacity_bytes};
pub use error::{MemoryError, Result};
pub use key::RegionKey;
pub use ledger::{DeviceLedger, ProcessReport, RegionReport, Totals};
pub use manager::{ManagerConfig, MemoryManager, Moved, ResidentGuard};
pub use region::{Element, Region, RegionView, RegionViewMut};
pub use share::{MappedRegion, SharedRegionInfo, recv_region, send_region};
pub use snapshot::SnapshotInfo;
pub use stats::{
    RssBreakdown, mem_available_bytes, process_rss, process_rss_bytes, system_shmem_bytes,
};
pub use sys::{recv_fds, send_fds};
pub use tag::{BackupPolicy, DType, RegionSpec, Tag};
