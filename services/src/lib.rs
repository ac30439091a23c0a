//! `tandem-services`: the host side of [`tandem_plugin_api::traits::HostServices`]: logging into `tracing`,
//! cancellation, and (once a worker sets them up) memory and transport.
//!
//! Memory and transport calls answer `NotAvailable` in a process that has no memory manager
//! or communicator attached (e.g. `tandem plugins`, `tandem check`); the worker runtime
//! attaches them before constructing components ([`Services::with_memory`]).
//!
//! Memory ([`memory`]): regions a plugin allocates are owned here (by id) until `free_region`; their key
//! (`memfd:<pid>:<fd>:<len>:<ino>`, see [`tandem_memory::RegionKey`]) lets another process of
//! the same user map them with `attach_region`, whose mappings are also kept here until freed.
//! Owned regions use the memory manager's ids; attached ones get ids from
//! [`ATTACHED_ID_BASE`] up. No lock of this module is held while the manager moves memory.
//!
//! Decoded tensors ([`decoded`]): the group [`decoded::DECODED_GROUP`] is no transport group
//! but the pipe through which a bridge's engine half hands its engine the tensors it decoded.
//!
//! Transport ([`transport`]): send / recv / broadcast on the named groups a worker joined
//! ([`Services::with_transport`], or [`Services::joining_transport`] while the rendezvous
//! runs on a thread of its own: a call waits for it, up to the join's own timeout).

#![forbid(unsafe_code)]

pub mod decoded;
mod memory;
mod transport;

pub use memory::ATTACHED_ID_BASE;

use memory::MemoryServices;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tandem_memory::MemoryManager;
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
    transport: Option<Arc<transport::TransportSlot>>,
    decoded: Arc<decoded::DecodedSlot>,
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
        self.transport = Some(Arc::new(transport::TransportSlot::ready(groups)));
        self
    }

    /// Joins the transport on a thread of its own (`join` runs the rendezvous and builds this
    /// process's groups), so a worker can report ready while its peers start; a transport
    /// call waits for the join, at most `wait`, and a failed join is every call's error.
    #[must_use]
    pub fn joining_transport<F>(mut self, wait: std::time::Duration, join: F) -> Self
    where
        F: FnOnce() -> Result<
                std::collections::BTreeMap<String, tandem_transport::Communicator>,
                tandem_transport::TransportError,
            > + Send
            + 'static,
    {
        self.transport = Some(transport::TransportSlot::joining(wait, join));
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
        self.mem().and_then(|m| m.pause(&tags)).into()
    }

    fn resume_tags(&self, tags: RVec<RString>) -> PResult<()> {
        self.mem().and_then(|m| m.resume(&tags)).into()
    }

    fn snapshot(&self, name: RString, tags: RVec<RString>) -> PResult<()> {
        self.mem().and_then(|m| m.snapshot(&name, &tags)).into()
    }

    fn restore(&self, name: RString) -> PResult<()> {
        self.mem().and_then(|m| m.restore(&name)).into()
    }

    fn drop_snapshot(&self, name: RString) -> PResult<()> {
        self.mem().and_then(|m| m.drop_snapshot(&name)).into()
    }

    fn memory_stats(&self) -> PResult<RVec<Metric>> {
        self.mem().map(|m| m.stats()).into()
    }

    fn send(&self, group: RStr<'_>, dst: u32, data: RSlice<'_, u8>, tag: u64) -> PResult<()> {
        match &self.transport {
            Some(t) => t
                .get()
                .and_then(|t| t.send(group.as_str(), dst, data.as_slice(), tag))
                .into(),
            None => not_available("transport"),
        }
    }

    fn recv(&self, group: RStr<'_>, src: u32, mut buf: RSliceMut<'_, u8>, tag: u64) -> PResult<()> {
        match &self.transport {
            Some(t) => t
                .get()
                .and_then(|t| t.recv(group.as_str(), src, buf.as_mut_slice(), tag))
                .into(),
            None => not_available("transport"),
        }
    }

    fn broadcast(&self, group: RStr<'_>, root: u32, mut buf: RSliceMut<'_, u8>) -> PResult<()> {
        if group.as_str() == decoded::DECODED_GROUP {
            return self
                .decoded
                .pipe()
                .and_then(|p| p.pop_into(buf.as_mut_slice()))
                .into();
        }
        match &self.transport {
            Some(t) => t
                .get()
                .and_then(|t| t.broadcast(group.as_str(), root, buf.as_mut_slice()))
                .into(),
            None => not_available("transport"),
        }
    }
}
