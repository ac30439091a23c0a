//! The host side of [`tandem_plugin_api::traits::HostServices`]: logging into `tracing`,
//! cancellation, and (once a worker sets them up) memory and transport.
//!
//! Memory and transport calls answer `NotAvailable` in a process that has no memory manager
//! or communicator attached (e.g. `tandem plugins`, `tandem check`); the worker runtime
//! attaches them before constructing components.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
}

impl Services {
    /// Services with nothing attached yet.
    pub fn new() -> Self {
        Self::default()
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
    RResult::RErr(
        PluginError::new(
            ErrorCode::NotAvailable,
            format!("host {what} services are not attached in this process"),
        )
        .with_help("memory and transport are available inside `tandem worker` processes"),
    )
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

    fn alloc_region(&self, _request: RegionRequest) -> PResult<RegionInfo> {
        not_available("memory")
    }

    fn free_region(&self, _id: u64) -> PResult<()> {
        not_available("memory")
    }

    fn attach_region(&self, _key: RString) -> PResult<RegionInfo> {
        not_available("memory")
    }

    fn pause_tags(&self, _tags: RVec<RString>) -> PResult<()> {
        not_available("memory")
    }

    fn resume_tags(&self, _tags: RVec<RString>) -> PResult<()> {
        not_available("memory")
    }

    fn snapshot(&self, _name: RString, _tags: RVec<RString>) -> PResult<()> {
        not_available("memory")
    }

    fn restore(&self, _name: RString) -> PResult<()> {
        not_available("memory")
    }

    fn drop_snapshot(&self, _name: RString) -> PResult<()> {
        not_available("memory")
    }

    fn memory_stats(&self) -> PResult<RVec<Metric>> {
        not_available("memory")
    }

    fn send(&self, _group: RStr<'_>, _dst: u32, _data: RSlice<'_, u8>, _tag: u64) -> PResult<()> {
        not_available("transport")
    }

    fn recv(&self, _group: RStr<'_>, _src: u32, _buf: RSliceMut<'_, u8>, _tag: u64) -> PResult<()> {
        not_available("transport")
    }

    fn broadcast(&self, _group: RStr<'_>, _root: u32, _buf: RSliceMut<'_, u8>) -> PResult<()> {
        not_available("transport")
    }
}
