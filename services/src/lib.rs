//! `tandem-services`: the host side of [`tandem_plugin_api::traits::HostServices`]: logging into `tracing`,
//! cancellation, and (once a worker sets them up) memory and transport.
//!
//! Memory and transport calls answer `NotAvailable` in a process that has no memory manager
//! or communicator attached (e.g. `tandem plugins`, `tandem check`); the worker runtime
//! attaches them before constructing components ([`Services::with_memory`]).
//!
//! Memory: regions a plugin allocates are owned here (by id) until `free_region`; their key
//! (`memfd:<pid>:<fd>:<len>:<ino>`, see [`tandem_memory::RegionKey`]) lets another process of
//! the same user map them with `attach_region`, whose mappings are also kept here until freed.
//! Owned regions use the memory manager's ids; attached ones get ids from
//! [`ATTACHED_ID_BASE`] up. No lock of this module is held while the manager moves memory.
//!
//! Transport ([`transport`]): send / recv / broadcast on the named groups a worker joined
//! ([`Services::with_transport`]).

#![forbid(unsafe_code)]

mod transport;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tandem_memory::{
    BackupPolicy, MappedRegion, MemoryError, MemoryManager, Region, RegionKey, RegionSpec, Tag,
};
use tandem_plugin_api::abi_stable::sabi_trait::TD_Opaque;
use tandem_plugin_api::abi_stable::std_types::{RArc, RSlice, RSliceMut, RStr};
use tandem_plugin_api::traits::{HostServices, HostServices_TO};
use tandem_plugin_api::{
    ErrorCode, HostBox, LogLevel, Metric, PResult, PluginError, RResult, RString, RVec, RegionInfo,
    RegionRequest,
};

/// Host services of one process.
#[derive(Clone, Default)]
pub struct Services {
    cancelled: Arc<AtomicBool>,
    memory: Option<Arc<MemoryServices>>,
    transport: Option<Arc<transport::TransportServices>>,
}

impl Services {
    /// Services with nothing attached yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Services whose memory calls go to `manager` (this process's manager for its device).
    pub fn with_memory(manager: MemoryManager) -> Self {
        Services {
            memory: Some(Arc::new(MemoryServices::new(manager))),
            ..Self::default()
        }
    }

    /// Adds the transport groups this process belongs to (name → communicator).
    #[must_use]
    pub fn with_transport(
        mut self,
        groups: std::collections::BTreeMap<String, tandem_transport::Communicator>,
    ) -> Self {
        self.transport = Some(Arc::new(transport::TransportServices::new(groups)));
        self
    }

    /// The memory manager attached, if any (e.g. to send its report to the controller).
    pub fn memory_manager(&self) -> Option<&MemoryManager> {
        self.memory.as_ref().map(|m| &m.manager)
    }

    /// Asks every plugin holding these services to stop.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// The ABI handle handed to plugin constructors.
    pub fn handle(&self) -> HostBox {
        HostServices_TO::from_ptr(RArc::new(self.clone()), TD_Opaque)
    }
}

fn not_available<T>(what: &str) -> PResult<T> {
    RResult::RErr(not_attached(what))
}

fn not_attached(what: &str) -> PluginError {
    PluginError::new(
        ErrorCode::NotAvailable,
        format!("host {what} services are not attached in this process"),
    )
    .with_help("memory and transport are available inside `tandem worker` processes")
}

impl Services {
    fn mem(&self) -> Result<&MemoryServices, PluginError> {
        self.memory.as_deref().ok_or_else(|| not_attached("memory"))
    }
}

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
struct MemoryServices {
    manager: MemoryManager,
    held: Mutex<HashMap<u64, Held>>,
    next_attached: AtomicU64,
}

impl MemoryServices {
    fn new(manager: MemoryManager) -> Self {
        MemoryServices {
            manager,
            held: Mutex::new(HashMap::new()),
            next_attached: AtomicU64::new(ATTACHED_ID_BASE),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn alloc(&self, req: RegionRequest) -> Result<RegionInfo, PluginError> {
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

    fn free(&self, id: u64) -> Result<(), PluginError> {
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

    fn attach(&self, key: &str) -> Result<RegionInfo, PluginError> {
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

    fn stats(&self) -> RVec<Metric> {
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

impl HostServices for Services {
    fn log(&self, level: LogLevel, target: RStr<'_>, message: RStr<'_>) {
        let (target, message) = (target.as_str(), message.as_str());
        match level {
            LogLevel::Trace => tracing::trace!(plugin = target, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin = target, "{message}"),
            LogLevel::Info => tracing::info!(plugin = target, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin = target, "{message}"),
            LogLevel::Error => tracing::error!(plugin = target, "{message}"),
        }
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn alloc_region(&self, request: RegionRequest) -> PResult<RegionInfo> {
        self.mem().and_then(|m| m.alloc(request)).into()
    }

    fn free_region(&self, id: u64) -> PResult<()> {
        self.mem().and_then(|m| m.free(id)).into()
    }

    fn attach_region(&self, key: RString) -> PResult<RegionInfo> {
        self.mem().and_then(|m| m.attach(key.as_str())).into()
    }

    fn pause_tags(&self, tags: RVec<RString>) -> PResult<()> {
        let r = self.mem().and_then(|m| {
            let tags = parse_tags(&tags)?;
            m.manager.pause(&tags).map_err(memory_error)
        });
        r.map(drop).into()
    }

    fn resume_tags(&self, tags: RVec<RString>) -> PResult<()> {
        let r = self.mem().and_then(|m| {
            let tags = parse_tags(&tags)?;
            m.manager.resume(&tags).map_err(memory_error)
        });
        r.map(drop).into()
    }

    fn snapshot(&self, name: RString, tags: RVec<RString>) -> PResult<()> {
        let r = self.mem().and_then(|m| {
            let tags = parse_tags(&tags)?;
            m.manager.snapshot(&name, &tags).map_err(memory_error)
        });
        r.map(drop).into()
    }

    fn restore(&self, name: RString) -> PResult<()> {
        let r = self
            .mem()
            .and_then(|m| m.manager.restore(&name).map_err(memory_error));
        r.map(drop).into()
    }

    fn drop_snapshot(&self, name: RString) -> PResult<()> {
        let r = self
            .mem()
            .and_then(|m| m.manager.drop_snapshot(&name).map_err(memory_error));
        r.into()
    }

    fn memory_stats(&self) -> PResult<RVec<Metric>> {
        self.mem().map(|m| m.stats()).into()
    }

    fn send(&self, group: RStr<'_>, dst: u32, data: RSlice<'_, u8>, tag: u64) -> PResult<()> {
        match &self.transport {
            Some(t) => t.send(group.as_str(), dst, data.as_slice(), tag).into(),
            None => not_available("transport"),
        }
    }

    fn recv(&self, group: RStr<'_>, src: u32, mut buf: RSliceMut<'_, u8>, tag: u64) -> PResult<()> {
        match &self.transport {
            Some(t) => t.recv(group.as_str(), src, buf.as_mut_slice(), tag).into(),
            None => not_available("transport"),
        }
    }

    fn broadcast(&self, group: RStr<'_>, root: u32, mut buf: RSliceMut<'_, u8>) -> PResult<()> {
        match &self.transport {
            Some(t) => t.broadcast(group.as_str(), root, buf.as_mut_slice()).into(),
            None => not_available("transport"),
        }
    }
}
