//! The FFI layer of the glue: a [`BufferProvider`] whose buffers are host memory regions
//! (`alloc_region`), viewed as `&[f32]` / `&mut [f32]` from the `(addr, len)` the host grants.
//!
//! When the host has no memory services attached (`alloc_region` answers `NotAvailable`, e.g.
//! `tandem generate` in the CLI process), [`PluginProvider`] falls back to plain `Vec` buffers
//! ([`VecProvider`]) and records that in [`PluginProvider::backing`].
//!
//! Region names are made unique per process (`<component>/<name>#<n>`): the core may allocate
//! a replacement buffer before dropping the one it replaces.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tandem_native_core::buffer::{BufferProvider, BufferTag, Region, VecProvider};
use tandem_native_core::error::{NativeError, Result};
use tandem_plugin_api::{DType, ErrorCode, HostBox, LogLevel, RResult, RString, RegionRequest};

/// Counter making region names unique within the process.
static NEXT_REGION: AtomicU64 = AtomicU64::new(0);

/// Host region keys of the live host regions of this process, by start address (so a
/// component can share a buffer it holds only as `Box<dyn Region>`).
static KEYS: Mutex<Option<HashMap<usize, String>>> = Mutex::new(None);

fn keys() -> std::sync::MutexGuard<'static, Option<HashMap<usize, String>>> {
    KEYS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The host region key (`memfd:...`) of the host region starting at `ptr`, if `ptr` is the
/// start of a live host region this process allocated.
pub fn region_key(ptr: *const f32) -> Option<String> {
    keys().as_ref()?.get(&(ptr as usize)).cloned()
}

/// Whether a tag's contents must survive a pause (weights, grads, optimizer) or may come back
/// zeroed (KV cache, activations).
pub fn backup_for(tag: BufferTag) -> bool {
    matches!(
        tag,
        BufferTag::Weights | BufferTag::Grads | BufferTag::Optimizer
    )
}

/// One host region holding f32 elements; freed (`free_region`) when dropped.
struct HostRegion {
    host: HostBox,
    id: u64,
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the region is plain memory owned by the host for this process until `free_region`;
// `HostRegion` is its only handle in the plugin, and `&`/`&mut` access follows Rust's rules
// through `as_slice`/`as_mut_slice`, so sharing or sending the handle across threads is sound.
unsafe impl Send for HostRegion {}
// SAFETY: see `Send`: shared access only hands out `&[f32]`.
unsafe impl Sync for HostRegion {}

impl Region for HostRegion {
    fn as_slice(&self) -> &[f32] {
        // SAFETY: the host granted `[ptr, ptr + len·4)` (page-aligned, so f32-aligned) to this
        // process until `free_region` (called only in `Drop`); the address stays valid across
        // pause/resume, and the glue never touches a region of a paused tag.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only live view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        if let Some(k) = keys().as_mut() {
            k.remove(&(self.ptr as usize));
        }
        if let RResult::RErr(e) = self.host.free_region(self.id) {
            self.host.log(
                LogLevel::Warn,
                "native".into(),
                format!("freeing region {}: {e}", self.id).as_str().into(),
            );
        }
    }
}

/// Another process's region mapped into this one (`attach_region`), viewed as f32;
/// unmapped (`free_region`) when dropped. Used by the engine to serve the trainer's weights
/// in place (`ipc` bridge).
pub struct AttachedRegion {
    inner: HostRegion,
    key: String,
}

impl AttachedRegion {
    /// Maps the region `key` and views its first `len` f32 elements; errors if the region is
    /// shorter or misaligned.
    pub fn attach(host: &HostBox, key: &str, len: usize) -> std::result::Result<Self, String> {
        let info = match host.attach_region(RString::from(key)) {
            RResult::ROk(info) => info,
            RResult::RErr(e) => return Err(format!("attach_region({key}): {e}")),
        };
        let inner = HostRegion {
            host: host.clone(),
            id: info.id,
            ptr: info.addr as *mut f32,
            len,
        };
        if (info.len as usize) < len * 4 || info.addr % std::mem::align_of::<f32>() != 0 {
            return Err(format!(
                "region {key} maps {} bytes at {:#x}; need {} bytes, f32-aligned",
                info.len,
                info.addr,
                len * 4
            ));
        }
        Ok(AttachedRegion {
            inner,
            key: key.to_string(),
        })
    }

    /// The key it was attached from.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Region for AttachedRegion {
    fn as_slice(&self) -> &[f32] {
        self.inner.as_slice()
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        self.inner.as_mut_slice()
    }
}

/// Where a [`PluginProvider`]'s buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Host memory regions (pause/resume/snapshot through the host).
    Host,
    /// Plain heap vectors: the host has no memory services in this process.
    Vec,
}

impl Backing {
    /// `host_regions` or `vec`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backing::Host => "host_regions",
            Backing::Vec => "vec",
        }
    }
}

/// Buffer provider of one component: host regions, or `Vec`s when the host has none.
pub struct PluginProvider {
    host: HostBox,
    prefix: String,
    backing: Backing,
    vec: VecProvider,
    /// f32 elements allocated so far per tag (all allocations, including replaced ones).
    allocated: Vec<(BufferTag, usize)>,
}

impl PluginProvider {
    /// Probes the host with a small region: `Host` backing if memory services answer, `Vec`
    /// (logged) if they are not attached; any other error is returned.
    pub fn new(host: HostBox, component: &str) -> Result<Self> {
        let mut p = PluginProvider {
            host,
            prefix: component.to_string(),
            backing: Backing::Host,
            vec: VecProvider::new(),
            allocated: Vec::new(),
        };
        match p.alloc_host(BufferTag::Activations, "probe", 1) {
            Ok(_) => {}
            Err(HostAlloc::NotAvailable) => {
                p.backing = Backing::Vec;
                p.host.log(
                    LogLevel::Info,
                    "native".into(),
                    format!(
                        "{component}: host memory services not attached; buffers are plain heap \
                         vectors (no release/resume through the memory layer)"
                    )
                    .as_str()
                    .into(),
                );
            }
            Err(HostAlloc::Failed(e)) => return Err(e),
        }
        p.allocated.clear();
        Ok(p)
    }

    /// Where the buffers live.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// The host handle.
    pub fn host(&self) -> &HostBox {
        &self.host
    }

    /// Bytes allocated under `tag` so far.
    pub fn bytes(&self, tag: BufferTag) -> usize {
        self.allocated
            .iter()
            .filter(|a| a.0 == tag)
            .map(|a| a.1 * 4)
            .sum()
    }

    fn alloc_host(
        &mut self,
        tag: BufferTag,
        name: &str,
        len: usize,
    ) -> std::result::Result<Box<dyn Region>, HostAlloc> {
        let n = NEXT_REGION.fetch_add(1, Ordering::Relaxed);
        let full = format!("{}/{name}#{n}", self.prefix);
        let request = RegionRequest {
            tag: RString::from(tag.as_str()),
            name: RString::from(full.as_str()),
            // Regions may not be empty; a zero-length buffer still gets one element.
            bytes: (len.max(1) * 4) as u64,
            dtype: DType::F32,
            backup: backup_for(tag),
        };
        match self.host.alloc_region(request) {
            RResult::ROk(info) => {
                if (info.len as usize) < len * 4 || info.addr % std::mem::align_of::<f32>() != 0 {
                    return Err(HostAlloc::Failed(NativeError::Buffer(format!(
                        "host granted region `{full}` of {} bytes at {:#x}; need {} bytes, \
                         f32-aligned",
                        info.len,
                        info.addr,
                        len * 4
                    ))));
                }
                keys()
                    .get_or_insert_with(HashMap::new)
                    .insert(info.addr, info.key.to_string());
                Ok(Box::new(HostRegion {
                    host: self.host.clone(),
                    id: info.id,
                    ptr: info.addr as *mut f32,
                    len,
                }))
            }
            RResult::RErr(e) if e.code == ErrorCode::NotAvailable => Err(HostAlloc::NotAvailable),
            RResult::RErr(e) => Err(HostAlloc::Failed(NativeError::Buffer(format!(
                "host region `{full}` ({} MiB, tag {}): {e}",
                (len * 4) >> 20,
                tag.as_str()
            )))),
        }
    }
}

enum HostAlloc {
    NotAvailable,
    Failed(NativeError),
}

impl BufferProvider for PluginProvider {
    fn alloc(&mut self, tag: BufferTag, name: &str, len: usize) -> Result<Box<dyn Region>> {
        let region = match self.backing {
            Backing::Vec => self.vec.alloc(tag, name, len)?,
            Backing::Host => match self.alloc_host(tag, name, len) {
                Ok(r) => r,
                Err(HostAlloc::NotAvailable) => {
                    return Err(NativeError::Buffer(format!(
                        "host memory services went away while allocating `{name}`"
                    )));
                }
                Err(HostAlloc::Failed(e)) => return Err(e),
            },
        };
        self.allocated.push((tag, len));
        Ok(region)
    }
}
