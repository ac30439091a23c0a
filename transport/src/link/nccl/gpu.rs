//! The GPU side of the NCCL link: one 2-rank communicator per pair, one stream and two device
//! staging buffers (`CTRL + CHUNK` bytes each) per world, allocated once on the worker thread
//! and reused by every round. A round copies the outgoing bytes host -> device, issues
//! `ncclSend` and `ncclRecv` inside one `ncclGroupStart`/`ncclGroupEnd` (so NCCL progresses
//! both directions together), polls the stream until both completed while watching the
//! communicator's asynchronous error (a dead peer ends the wait), then copies the incoming
//! bytes device -> host and synchronises the stream before the buffers are reused.

use super::hub::{CHUNK, CTRL, Stop, Wire};
use crate::error::{Result, TransportError};
use cudarc::driver::sys::{CUresult, cuStreamQuery};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result as nres, sys as nsys};
use std::ffi::CStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A communicator, aborted when dropped (after its last round, or after an error).
struct RawComm(nsys::ncclComm_t);

impl Drop for RawComm {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful ncclCommInitRank and is dropped once; abort
        // is NCCL's documented way to end a communicator, also with an operation still in
        // flight (a round that failed on a dead peer).
        if let Err(e) = unsafe { nres::comm_abort(self.0) } {
            tracing::warn!("tandem-transport: ncclCommAbort failed: {:?}", e.0);
        }
    }
}

pub(super) struct GpuWire {
    comms: Vec<Option<RawComm>>,
    /// The peer's NCCL rank (0 or 1) in each pair's communicator.
    peer_nccl: Vec<i32>,
    /// The peer's world rank, for messages.
    peer_rank: Vec<usize>,
    send: CudaSlice<u8>,
    recv: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

/// What one pair needs to join its communicator: the peer's world rank, this side's NCCL
/// rank (the lower world rank is 0) and the unique id.
pub(super) struct PairInit {
    pub peer: usize,
    pub my_nccl: i32,
    pub id: nsys::ncclUniqueId,
}

fn nccl_msg(r: nsys::ncclResult_t, comm: Option<nsys::ncclComm_t>) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any result code.
    let what = unsafe { CStr::from_ptr(nsys::ncclGetErrorString(r)) };
    let last = comm
        // SAFETY: the communicator is live; ncclGetLastError returns a NUL-terminated string
        // owned by NCCL that stays valid until the next NCCL call on this thread.
        .map(|c| unsafe { CStr::from_ptr(nsys::ncclGetLastError(c)) })
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(
        "{r:?} ({}){}",
        what.to_string_lossy(),
        if last.is_empty() {
            String::new()
        } else {
            format!(": {last}")
        }
    )
}

impl GpuWire {
    /// Joins every pair's communicator, in the order given (the global pair order), on
    /// CUDA device `dev`. Runs on the worker thread.
    pub(super) fn new(dev: usize, pairs: Vec<PairInit>) -> Result<Self> {
        let first = pairs.first().map_or(0, |p| p.peer);
        let derr = |e: cudarc::driver::DriverError| TransportError::Device {
            rank: first,
            msg: format!("CUDA device {dev}: {e}"),
        };
        let ctx = CudaContext::new(dev).map_err(derr)?;
        let stream = ctx.new_stream().map_err(derr)?;
        let send = stream.alloc_zeros::<u8>(CTRL + CHUNK).map_err(derr)?;
        let recv = stream.alloc_zeros::<u8>(CTRL + CHUNK).map_err(derr)?;
        stream.synchronize().map_err(derr)?;
        let mut wire = GpuWire {
            comms: Vec::with_capacity(pairs.len()),
            peer_nccl: pairs.iter().map(|p| 1 - p.my_nccl).collect(),
            peer_rank: pairs.iter().map(|p| p.peer).collect(),
            send,
            recv,
            stream,
        };
        for p in pairs {
            let mut comm: nsys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: `comm` is a valid out-pointer; the id came from the lower rank's
            // ncclGetUniqueId through the store; both sides pass nranks 2 and distinct ranks.
            unsafe { nres::comm_init_rank(&mut comm, 2, p.id, p.my_nccl) }.map_err(|e| {
                TransportError::Device {
                    rank: p.peer,
                    msg: format!("ncclCommInitRank: {}", nccl_msg(e.0, None)),
                }
            })?;
            wire.comms.push(Some(RawComm(comm)));
        }
        Ok(wire)
    }

    /// Polls the stream until the round's work completed; fails when the communicator
    /// reports an asynchronous error (a dead peer, a broken socket).
    fn wait(&self, comm: nsys::ncclComm_t) -> std::result::Result<(), Stop> {
        let t0 = Instant::now();
        loop {
            // SAFETY: the stream handle is owned by `self.stream`, alive for this call.
            match unsafe { cuStreamQuery(self.stream.cu_stream()) } {
                CUresult::CUDA_SUCCESS => return Ok(()),
                CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(Stop::Failed(format!("cuStreamQuery: {e:?}"))),
            }
            let mut st = nsys::ncclResult_t::ncclSuccess;
            // SAFETY: `comm` is live (not retired) and `st` is a valid out-pointer.
            let r = unsafe { nsys::ncclCommGetAsyncError(comm, &mut st) };
            let bad = [r, st].into_iter().find(|s| {
                !matches!(
                    s,
                    nsys::ncclResult_t::ncclSuccess | nsys::ncclResult_t::ncclInProgress
                )
            });
            if let Some(s) = bad {
                let msg = nccl_msg(s, Some(comm));
                return Err(match s {
                    nsys::ncclResult_t::ncclRemoteError | nsys::ncclResult_t::ncclSystemError => {
                        Stop::PeerDied(msg)
                    }
                    _ => Stop::Failed(msg),
                });
            }
            if t0.elapsed() < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

impl Wire for GpuWire {
    fn exchange(&mut self, i: usize, out: &[u8], inb: &mut [u8]) -> std::result::Result<(), Stop> {
        let comm = match self.comms.get(i) {
            Some(Some(c)) => c.0,
            _ => {
                return Err(Stop::Failed(format!(
                    "NCCL pair {i} used after it was retired"
                )));
            }
        };
        let peer = self.peer_nccl[i];
        let fail = |what: &str, e: cudarc::driver::DriverError| {
            Stop::Failed(format!("{what} with rank {}: {e}", self.peer_rank[i]))
        };
        let stream = &self.stream;
        stream
            .memcpy_htod(out, &mut self.send.slice_mut(..out.len()))
            .map_err(|e| fail("staging host -> device", e))?;
        {
            let (sp, _s) = self.send.device_ptr(stream);
            let (rp, _r) = self.recv.device_ptr_mut(stream);
            let cu = stream.cu_stream() as nsys::cudaStream_t;
            let u8t = nsys::ncclDataType_t::ncclUint8;
            nres::group_start().map_err(|e| Stop::Failed(nccl_msg(e.0, Some(comm))))?;
            // SAFETY: `sp`/`rp` point to device buffers of `CTRL + CHUNK` bytes (at least
            // `out.len()`/`inb.len()`, which the hub bounds), kept alive by `self` until the
            // stream is synchronised below; `comm` is live; the peer posts the matching recv
            // and send with the same lengths in the same round.
            let s = unsafe { nres::send(sp as _, out.len(), u8t, peer, comm, cu) };
            // SAFETY: as above, for the receive buffer.
            let r = unsafe { nres::recv(rp as _, inb.len(), u8t, peer, comm, cu) };
            let end = nres::group_end();
            for res in [s, r, end] {
                res.map_err(|e| Stop::Failed(nccl_msg(e.0, Some(comm))))?;
            }
        }
        self.wait(comm)?;
        self.stream
            .memcpy_dtoh(&self.recv.slice(..inb.len()), inb)
            .map_err(|e| fail("staging device -> host", e))?;
        self.stream
            .synchronize()
            .map_err(|e| fail("stream synchronise", e))
    }

    fn retire(&mut self, i: usize) {
        if let Some(c) = self.comms.get_mut(i) {
            *c = None;
        }
    }
}
