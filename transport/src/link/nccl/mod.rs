//! NCCL link (feature `cuda`). One 2-rank NCCL communicator per pair (unique id through the
//! rendezvous store, the lower rank is NCCL rank 0), and ONE worker thread per world that
//! issues every CUDA and NCCL call, one operation at a time, in a fixed global order of pairs
//! ([`hub`]). A link's send copies bytes into the pair's outgoing pipe and its receive takes
//! them from the incoming one, so the order in which callers send, receive, run collectives
//! or `isend` threads never reaches NCCL. The worker stages bytes through two device buffers
//! allocated once per world ([`gpu`]).
//!
//! The link honours the idle timeout (a receive with nothing arriving, a send whose pipe stays
//! full), and a peer whose NCCL connection breaks is reported as `PeerDied`. A peer that
//! hangs inside NCCL without an error stalls this world's worker (every NCCL pair of the
//! process), which the waits above then report as timeouts.
//!
//! Library lookup: cudarc 0.19 opens `libnccl.so`, `libnccl.so.12`, `.11`, `.10`, `.9`, `.1`
//! and a few Windows-style names, never `libnccl.so.2`, the only name NCCL's own packages and
//! the `nvidia-nccl-cu12`/`-cu13` wheels ship. It cannot be told another name, and loading
//! `libnccl.so.2` first (even `RTLD_GLOBAL`) does not help: the dynamic loader matches an
//! already-loaded library by its file name or SONAME, and `libnccl.so` is neither. So a
//! `libnccl.so` symlink must be on the library path; [`missing_hint`] finds `libnccl.so.2`
//! and says which link to make.

mod gpu;
mod hub;
#[cfg(test)]
mod tests;

use super::{FrameHeader, HEADER_LEN, Link, PeerInfo};
use crate::comm::config::CommConfig;
use crate::error::{Result, TransportError};
use crate::plan::BackendKind;
use crate::store::StoreClient;
use crate::topology::Device;
use cudarc::nccl::{result as nres, sys as nsys};
use hub::{HubHandle, Pair};
use std::ffi::{CStr, c_char};
use std::sync::{Arc, Once};
use std::time::Duration;

/// True when libcuda and libnccl can be loaded. When only `libnccl.so.2` is found, logs (once)
/// the symlink that would fix it.
pub(crate) fn available() -> bool {
    // SAFETY: both functions only try to dlopen the library and report whether it loaded.
    let ok =
        unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nccl::sys::is_culib_present() };
    if !ok && let Some(hint) = missing_hint() {
        static WARN: Once = Once::new();
        WARN.call_once(|| tracing::warn!("tandem-transport: NCCL is unavailable: {hint}"));
    }
    ok
}

/// Why libcuda or libnccl cannot be loaded and what to do; `None` when both load.
pub(crate) fn missing_hint() -> Option<String> {
    // SAFETY: only tries to dlopen libcuda and reports whether it loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Some(
            "libcuda.so (the NVIDIA driver's library) cannot be loaded: install the driver or \
             put the directory holding libcuda.so on LD_LIBRARY_PATH"
                .into(),
        );
    }
    // SAFETY: only tries to dlopen libnccl under cudarc's names and reports whether it loaded.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        return None;
    }
    Some(match nccl_so2_path() {
        Some(path) => {
            let dir = std::path::Path::new(&path)
                .parent()
                .map_or_else(|| ".".into(), |d| d.display().to_string());
            format!(
                "{path} is loadable but cudarc only looks for libnccl.so (and .so.12/.11/.10/.9/.1), \
                 never libnccl.so.2: run `ln -s {path} {dir}/libnccl.so` (or link it into any \
                 directory on LD_LIBRARY_PATH) and restart the process"
            )
        }
        None => "libnccl cannot be loaded: install NCCL (e.g. the nvidia-nccl-cu12 wheel) and \
                 put its lib directory on LD_LIBRARY_PATH with a libnccl.so symlink to the \
                 libnccl.so.2 there (cudarc never opens libnccl.so.2)"
            .into(),
    })
}

/// The path of `libnccl.so.2` when the dynamic loader finds it.
fn nccl_so2_path() -> Option<String> {
    // SAFETY: dlopen with a NUL-terminated name; NCCL's initialisers have no preconditions.
    let h = unsafe { libc::dlopen(c"libnccl.so.2".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        return None;
    }
    // SAFETY: `h` is a live handle; the symbol name is NUL-terminated.
    let sym = unsafe { libc::dlsym(h, c"ncclGetVersion".as_ptr()) };
    // SAFETY: an all-zero Dl_info is valid (null pointers); dladdr fills it for a loaded symbol.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `sym` came from dlsym on a live handle; `info` is a valid out-pointer; the file
    // name dladdr returns is NUL-terminated and owned by the loader while `h` is open.
    let path = (!sym.is_null()
        && unsafe { libc::dladdr(sym, &mut info) } != 0
        && !info.dli_fname.is_null())
    .then(|| {
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    });
    // SAFETY: `h` is a live handle from dlopen above, closed once, after its last use.
    unsafe { libc::dlclose(h) };
    path.or_else(|| Some("libnccl.so.2".into()))
}

/// One end of an NCCL pair: its pipes and the world's worker.
pub(crate) struct NcclLink {
    pair: Arc<Pair>,
    hub: Arc<HubHandle>,
    peer: PeerInfo,
}

/// Creates the links from `me` to every rank in `peers` (planned on NCCL): exchanges the
/// unique ids through the store, then starts the world's worker, which joins the
/// communicators in the global order of (lower, higher) rank pairs (so the blocking NCCL inits
/// cannot wait in a cycle). Returns `(peer rank, link)` in that order.
pub(crate) fn connect_all(
    cfg: &CommConfig,
    store: &StoreClient,
    me: usize,
    peers: &[usize],
) -> Result<Vec<(usize, NcclLink)>> {
    let Some(&first) = peers.first() else {
        return Ok(Vec::new());
    };
    if let Some(hint) = missing_hint() {
        return Err(TransportError::Unsupported(format!(
            "rank {me} has peers planned on NCCL (first: rank {first}) but {hint}; or set \
             transport = \"auto\" on a CPU host"
        )));
    }
    let Device::Cuda(dev) = cfg.placement.device else {
        return Err(TransportError::Invalid(format!(
            "rank {me} is placed on {} but NCCL needs a CUDA device",
            cfg.placement.device
        )));
    };
    let mut order = peers.to_vec();
    order.sort_by_key(|&r| (r.min(me), r.max(me)));
    let mut inits = Vec::with_capacity(order.len());
    for &r in &order {
        let key = format!("{}/nccl/{}-{}", cfg.name, me.min(r), me.max(r));
        let id = if me < r {
            let id = nres::get_uniqueid().map_err(|e| TransportError::Device {
                rank: r,
                msg: format!("ncclGetUniqueId: {:?}", e.0),
            })?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            store.set(&key, &bytes)?;
            id
        } else {
            let bytes = store.get(&key)?;
            let mut internal = [0 as c_char; 128];
            if bytes.len() != internal.len() {
                return Err(TransportError::Store {
                    addr: store.addr().into(),
                    msg: format!(
                        "key {key} holds {} bytes, not a 128-byte NCCL id",
                        bytes.len()
                    ),
                });
            }
            for (d, s) in internal.iter_mut().zip(&bytes) {
                *d = *s as c_char;
            }
            nsys::ncclUniqueId { internal }
        };
        inits.push(gpu::PairInit {
            peer: r,
            my_nccl: i32::from(me > r),
            id,
        });
    }
    let linger = cfg.timeout.min(Duration::from_secs(30));
    let (hub, pairs) = hub::start(
        move || gpu::GpuWire::new(dev as usize, inits),
        order.len(),
        linger,
    )?;
    Ok(order
        .into_iter()
        .zip(pairs)
        .map(|(r, pair)| {
            let peer = PeerInfo {
                rank: r,
                addr: format!("nccl pair {}-{}", me.min(r), me.max(r)),
                timeout: cfg.timeout,
            };
            let hub = Arc::clone(&hub);
            (r, NcclLink { pair, hub, peer })
        })
        .collect())
}

impl Link for NcclLink {
    fn send_frame(&self, hdr: &FrameHeader, payload: &[u8], idle: Duration) -> Result<()> {
        self.pair
            .write(&self.hub, &hdr.encode(), idle, &self.peer)?;
        self.pair.write(&self.hub, payload, idle, &self.peer)
    }

    fn recv_header(&self, idle: Duration) -> Result<FrameHeader, (TransportError, bool)> {
        let mut b = [0u8; HEADER_LEN];
        match self.pair.read(&self.hub, &mut b, true, idle, &self.peer) {
            Ok(()) => FrameHeader::decode(&b, &self.peer).map_err(|e| (e, false)),
            // A timed-out whole read consumed nothing: the link stays usable.
            Err(e @ TransportError::Timeout { .. }) => Err((e, true)),
            Err(e) => Err((e, false)),
        }
    }

    fn recv_payload(&self, buf: &mut [u8], idle: Duration) -> Result<()> {
        self.pair.read(&self.hub, buf, false, idle, &self.peer)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Nccl
    }

    fn peer(&self) -> &PeerInfo {
        &self.peer
    }
}
