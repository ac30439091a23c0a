//! NCCL link (feature `cuda`): two 2-rank NCCL communicators per pair, one per direction (so
//! a send and a receive on one pair progress concurrently, each on its own stream), with
//! unique ids exchanged through the rendezvous store. Host bytes are staged through device
//! memory in chunks; the lower rank is NCCL rank 0 of both. Compile-checked here (no GPU on
//! the build machine); run on one H100 by `tests/nccl.rs`, where it hangs intermittently (see
//! transport/ARCH-NOTES.md, "On a GPU"). Every entry point checks that libcuda and libnccl
//! are loadable first, because cudarc panics instead of returning an error when they are
//! missing.
//!
//! Known gap: NCCL calls block on the stream and do not honour the idle timeout; a dead peer
//! is reported by NCCL itself (or hangs until NCCL's own watchdog), not by this layer.

use super::{FrameHeader, HEADER_LEN, Link, PeerInfo};
use crate::comm::config::CommConfig;
use crate::error::{Result, TransportError};
use crate::plan::BackendKind;
use crate::store::StoreClient;
use crate::topology::Device;
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{Comm, Id};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Device staging chunk; sender and receiver split payloads identically.
const CHUNK: usize = 64 << 20;

/// True when libcuda and libnccl can be loaded.
pub(crate) fn available() -> bool {
    // SAFETY: both functions only try to dlopen the library and report whether it loaded.
    unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nccl::sys::is_culib_present() }
}

struct CommBox(Comm);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; every use goes through the `Mutex` in `NcclLink`.
unsafe impl Send for CommBox {}

/// One direction: a communicator and its stream.
struct Dir {
    comm: Mutex<CommBox>,
    stream: Arc<CudaStream>,
}

pub(crate) struct NcclLink {
    tx: Dir,
    rx: Dir,
    peer_nccl: i32,
    peer: PeerInfo,
}

impl NcclLink {
    /// Creates the pair communicator between `me` and `r` (blocks until both joined).
    pub(crate) fn connect(
        cfg: &CommConfig,
        store: &StoreClient,
        me: usize,
        r: usize,
    ) -> Result<Self> {
        let peer = PeerInfo {
            rank: r,
            addr: format!("nccl pair {}-{}", me.min(r), me.max(r)),
            timeout: cfg.timeout,
        };
        if !available() {
            return Err(TransportError::Unsupported(format!(
                "ranks {me} and {r} were planned on NCCL but libcuda/libnccl cannot be loaded; \
                 install them (check LD_LIBRARY_PATH) or set transport = \"auto\" on a CPU host"
            )));
        }
        let Device::Cuda(dev) = cfg.placement.device else {
            return Err(TransportError::Invalid(format!(
                "rank {me} is placed on {} but NCCL needs a CUDA device",
                cfg.placement.device
            )));
        };
        let derr = |e: cudarc::driver::DriverError| TransportError::Device {
            rank: r,
            msg: format!("{e}"),
        };
        let nerr = |e: cudarc::nccl::result::NcclError| TransportError::Device {
            rank: r,
            msg: format!("{:?}", e.0),
        };
        let ctx = CudaContext::new(dev as usize).map_err(derr)?;
        let my_nccl = usize::from(me > r);
        // Direction 0 carries lower -> higher, direction 1 higher -> lower; both sides create
        // them in the same order.
        let mut dirs = Vec::with_capacity(2);
        for d in 0..2 {
            let stream = ctx.new_stream().map_err(derr)?;
            let key = format!("{}/nccl/{}-{}/{d}", cfg.name, me.min(r), me.max(r));
            let id = if me < r {
                let id = Id::new().map_err(nerr)?;
                let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
                store.set(&key, &bytes)?;
                id
            } else {
                let bytes = store.get(&key)?;
                let mut internal = [0 as std::ffi::c_char; 128];
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
                    *d = *s as std::ffi::c_char;
                }
                Id::uninit(internal)
            };
            let comm = Comm::from_rank(Arc::clone(&stream), my_nccl, 2, id).map_err(nerr)?;
            dirs.push(Dir {
                comm: Mutex::new(CommBox(comm)),
                stream,
            });
        }
        let (d1, d0) = (dirs.pop(), dirs.pop());
        let (Some(d0), Some(d1)) = (d0, d1) else {
            return Err(TransportError::Invalid(
                "NCCL set-up lost a direction".into(),
            ));
        };
        let (tx, rx) = if me < r { (d0, d1) } else { (d1, d0) };
        Ok(NcclLink {
            tx,
            rx,
            peer_nccl: 1 - my_nccl as i32,
            peer,
        })
    }

    fn derr(&self, e: cudarc::driver::DriverError) -> TransportError {
        TransportError::Device {
            rank: self.peer.rank,
            msg: format!("{e}"),
        }
    }

    fn nerr(&self, e: cudarc::nccl::result::NcclError) -> TransportError {
        TransportError::Device {
            rank: self.peer.rank,
            msg: format!("{:?}", e.0),
        }
    }

    fn send_bytes(&self, data: &[u8]) -> Result<()> {
        let comm = self.tx.comm.lock().unwrap_or_else(PoisonError::into_inner);
        let stream = &self.tx.stream;
        for chunk in data.chunks(CHUNK) {
            let dev = stream.clone_htod(chunk).map_err(|e| self.derr(e))?;
            comm.0
                .send(&dev, self.peer_nccl)
                .map_err(|e| self.nerr(e))?;
            stream.synchronize().map_err(|e| self.derr(e))?;
        }
        Ok(())
    }

    fn recv_bytes(&self, buf: &mut [u8]) -> Result<()> {
        let comm = self.rx.comm.lock().unwrap_or_else(PoisonError::into_inner);
        let stream = &self.rx.stream;
        for chunk in buf.chunks_mut(CHUNK) {
            let mut dev = stream
                .alloc_zeros::<u8>(chunk.len())
                .map_err(|e| self.derr(e))?;
            comm.0
                .recv(&mut dev, self.peer_nccl)
                .map_err(|e| self.nerr(e))?;
            stream.memcpy_dtoh(&dev, chunk).map_err(|e| self.derr(e))?;
            stream.synchronize().map_err(|e| self.derr(e))?;
        }
        Ok(())
    }
}

impl Link for NcclLink {
    fn send_frame(&self, hdr: &FrameHeader, payload: &[u8], _idle: Duration) -> Result<()> {
        self.send_bytes(&hdr.encode())?;
        if !payload.is_empty() {
            self.send_bytes(payload)?;
        }
        Ok(())
    }

    fn recv_header(&self, _idle: Duration) -> Result<FrameHeader, (TransportError, bool)> {
        let mut b = [0u8; HEADER_LEN];
        self.recv_bytes(&mut b).map_err(|e| (e, false))?;
        FrameHeader::decode(&b, &self.peer).map_err(|e| (e, false))
    }

    fn recv_payload(&self, buf: &mut [u8], _idle: Duration) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.recv_bytes(buf)
    }

    fn discard_payload(&self, mut len: u64, idle: Duration) -> Result<()> {
        // Must mirror the sender's chunking: receive the whole payload in CHUNK pieces.
        let mut scratch = vec![0u8; len.min(CHUNK as u64) as usize];
        while len > 0 {
            let n = len.min(CHUNK as u64) as usize;
            self.recv_payload(&mut scratch[..n], idle)?;
            len -= n as u64;
        }
        Ok(())
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Nccl
    }

    fn peer(&self) -> &PeerInfo {
        &self.peer
    }
}
