//! The memory half of the host services: regions a plugin allocates are owned here (by id)
//! until `free_region`; regions of other processes it attaches by key are mapped here until
//! freed, with ids from [`ATTACHED_ID_BASE`] up; tag-wide calls go to the memory manager.
//! Memory-layer errors become ABI errors with a code a caller can act on and a help line.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use tandem_memory::{
    BackupPolicy, MappedRegion, MemoryError, MemoryManager, Region, RegionKey, RegionSpec, Tag,
};
use tandem_plugin_api::{ErrorCode, Metric, PluginError, RString, RVec, RegionInfo, RegionRequest};

/// First id given to an attached (peer) region; owned regions use the manager's ids below it.
pub const ATTACHED_ID_BASE: u64 = 1 << 62;

/// A region this process holds for its plugins.
enum Held {
    /// Allocated here; dropping it (the `_region` handle) frees the region.
    Owned { _region: Region, name: String },
    /// Another process's region mapped here; dropping it unmaps it.
    Attached(MappedRegion),
}

/// The memory half of the services: the manager and the regions handed to plugins.
pub(super) struct MemoryServices {
    pub(super) manager: MemoryManager,
    held: Mutex<HashMap<u64, Held>>,
    next_attached: AtomicU64,
}

impl MemoryServices {
    pub(super) fn new(manager: MemoryManager) -> Self {
        MemoryServices {
            manager,
            held: Mutex::new(HashMap::new()),
            next_attached: AtomicU64::new(ATTACHED_ID_BASE),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn alloc(&self, req: RegionRequest) -> Result<RegionInfo, PluginError> {
        let tag: Tag = req.tag.parse().map_err(memory_error)?;
        let name = req.name.to_string();
        let taken = |held: &HashMap<u64, Held>| {
            held.values()
                .any(|h| matches!(h, Held::Owned { name: n, .. } if !name.is_empty() && *n == name))
        };
        if taken(&self.held()) {
            return Err(duplicate_name(&name));
        }
        let size = usize::try_from(req.bytes).map_err(|_| {
            PluginError::invalid_input(format!(
                "region `{name}` (tag `{tag}`): {} bytes do not fit this machine's address space",
                req.bytes
            ))
        })?;
        let backup = if req.backup {
            BackupPolicy::Cpu
        } else {
            BackupPolicy::Discard
        };
        let spec = RegionSpec::new(tag, size, dtype(req.dtype)).with_backup(backup);
        // The manager allocates without our lock held; the region is inserted afterwards.
        let region = self.manager.alloc(spec).map_err(memory_error)?;
        let key = RegionKey::of(&region).map_err(memory_error)?;
        let info = RegionInfo {
            id: region.id(),
            key: RString::from(key.to_string()),
            addr: region.as_ptr() as usize,
            len: region.len() as u64,
        };
        let mut held = self.held();
        if taken(&held) {
            drop(held);
            return Err(duplicate_name(&name));
        }
        held.insert(
            info.id,
            Held::Owned {
                _region: region,
                name,
            },
        );
        Ok(info)
    }

    pub(super) fn free(&self, id: u64) -> Result<(), PluginError> {
        let removed = self.held().remove(&id);
        match removed {
            // Dropped here, after our lock is released (dropping a region takes the manager's).
            Some(h) => {
                drop(h);
                Ok(())
            }
            None => Err(PluginError::invalid_input(format!(
                "free_region: no region with id {id} in this process"
            ))
            .with_help("pass an id returned by alloc_region or attach_region, and free it once")),
        }
    }

    pub(super) fn attach(&self, key: &str) -> Result<RegionInfo, PluginError> {
        let parsed: RegionKey = key.parse().map_err(memory_error)?;
        let mapped = parsed.attach().map_err(memory_error)?;
        let id = self.next_attached.fetch_add(1, Ordering::Relaxed);
        let info = RegionInfo {
            id,
            key: RString::from(key),
            addr: mapped.as_ptr() as usize,
            len: mapped.len() as u64,
        };
        self.held().insert(id, Held::Attached(mapped));
        Ok(info)
    }

    pub(super) fn stats(&self) -> RVec<Metric> {
        let report = self.manager.report();
        let mut out = RVec::new();
        let mut push = |name: String, v: u64| out.push(Metric::new(&name, v as f64));
        for (tag, t) in report.by_tag() {
            push(format!("regions.{tag}"), t.regions);
            push(format!("size_bytes.{tag}"), t.size_bytes);
            push(format!("resident_bytes.{tag}"), t.resident_bytes);
            push(format!("paused_bytes.{tag}"), t.paused_bytes);
            push(format!("backup_bytes.{tag}"), t.backup_bytes);
            push(
                format!("retained_backup_bytes.{tag}"),
                t.retained_backup_bytes,
            );
            push(format!("allocated_bytes.{tag}"), t.allocated_bytes);
        }
        let t = report.totals();
        push("regions".into(), t.regions);
        push("size_bytes".into(), t.size_bytes);
        push("resident_bytes".into(), t.resident_bytes);
        push("paused_bytes".into(), t.paused_bytes);
        push("backup_bytes".into(), t.backup_bytes);
        push("retained_backup_bytes".into(), t.retained_backup_bytes);
        push("allocated_bytes".into(), t.allocated_bytes);
        push("snapshot_bytes".into(), report.snapshot_bytes);
        push("peak_resident_bytes".into(), report.peak_resident_bytes);
        if let Some(cap) = report.cap_bytes {
            push("cap_bytes".into(), cap);
        }
        let (n, bytes) = self
            .held()
            .values()
            .fold((0u64, 0u64), |(n, b), h| match h {
                Held::Attached(m) => (n + 1, b + m.len() as u64),
                Held::Owned { .. } => (n, b),
            });
        push("attached_regions".into(), n);
        push("attached_bytes".into(), bytes);
        out
    }

    /// Pauses every region of `tags`.
    pub(super) fn pause(&self, tags: &RVec<RString>) -> Result<(), PluginError> {
        let tags = parse_tags(tags)?;
        self.manager.pause(&tags).map(drop).map_err(memory_error)
    }

    /// Resumes every region of `tags`.
    pub(super) fn resume(&self, tags: &RVec<RString>) -> Result<(), PluginError> {
        let tags = parse_tags(tags)?;
        self.manager.resume(&tags).map(drop).map_err(memory_error)
    }

    /// Snapshots every region of `tags` under `name`.
    pub(super) fn snapshot(&self, name: &str, tags: &RVec<RString>) -> Result<(), PluginError> {
        let tags = parse_tags(tags)?;
        self.manager
            .snapshot(name, &tags)
            .map(drop)
            .map_err(memory_error)
    }

    /// Restores the snapshot `name`.
    pub(super) fn restore(&self, name: &str) -> Result<(), PluginError> {
        self.manager.restore(name).map(drop).map_err(memory_error)
    }

    /// Drops the snapshot `name`.
    pub(super) fn drop_snapshot(&self, name: &str) -> Result<(), PluginError> {
        self.manager.drop_snapshot(name).map_err(memory_error)
    }
}
fn duplicate_name(name: &str) -> PluginError {
    PluginError::invalid_input(format!(
        "alloc_region: a region named `{name}` already exists in this process"
    ))
    .with_help("give each region a unique name, or free the old one first")
}

fn parse_tags(tags: &RVec<RString>) -> Result<Vec<Tag>, PluginError> {
    tags.iter()
        .map(|t| t.parse::<Tag>().map_err(memory_error))
        .collect()
}

fn dtype(d: tandem_plugin_api::DType) -> tandem_memory::DType {
    use tandem_memory::DType as M;
    use tandem_plugin_api::DType as P;
    match d {
        P::F32 => M::F32,
        P::BF16 => M::BF16,
        P::F16 => M::F16,
        P::U8 => M::U8,
        P::I32 => M::I32,
        P::I64 => M::I64,
    }
}

/// Maps a memory-layer error to the ABI error: its message (which already says how to fix it)
/// under the code a caller can act on, plus a help line.
fn memory_error(e: MemoryError) -> PluginError {
    use MemoryError as E;
    let (code, help) = match &e {
        E::Parse { help, .. } => (ErrorCode::InvalidInput, help.clone()),
        E::ZeroSize { .. } | E::PartialElement { .. } | E::InvalidArgument(_) => (
            ErrorCode::InvalidInput,
            "check the region request (tag, size in bytes, dtype)".to_owned(),
        ),
        E::UnknownSnapshot { .. } => (
            ErrorCode::InvalidInput,
            "take the snapshot with `snapshot` first, or use one of the names listed".to_owned(),
        ),
        E::OverBudget { .. } => (
            ErrorCode::InvalidState,
            "pause or free regions, or raise the process's memory fraction in the job file"
                .to_owned(),
        ),
        E::AlreadyPaused { .. }
        | E::NotPaused { .. }
        | E::KeptResident { .. }
        | E::Borrowed { .. }
        | E::Paused { .. }
        | E::StaleSnapshot { .. } => (
            ErrorCode::InvalidState,
            "see `memory_stats` for which regions are paused or resident".to_owned(),
        ),
        E::GuardTimeout { .. } => (
            ErrorCode::Timeout,
            "the guard holder did not release the tag in time".to_owned(),
        ),
        E::Attach { .. } => (
            ErrorCode::Unavailable,
            "attach while the owner process is alive and still holds the region".to_owned(),
        ),
        E::Sys { .. } | E::Proc { .. } | E::Cuda(_) => (
            ErrorCode::Runtime,
            "the operating system refused the memory operation; check free memory and limits"
                .to_owned(),
        ),
    };
    PluginError::new(code, e.to_string()).with_help(help)
}
