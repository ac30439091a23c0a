//! Shared-memory link between two processes on one host: one memfd holding two SPSC rings
//! (one per direction), created by the lower rank and passed to the higher rank over a Unix
//! socket with SCM_RIGHTS. The socket stays open as a liveness signal: when the peer process
//! dies, the kernel closes it and waiting calls fail with `PeerDied` instead of hanging.
//!
//! Layout of the memfd: page 0 = header {magic, cap}; page 1 = control of direction 0
//! (lower -> higher rank); page 2 = direction 1; then ring 0 and ring 1 (`cap` bytes each).

mod bcast;
mod cma;
mod copy;
mod fdpass;
mod futex;
mod policy;
mod ring;
mod vm;

pub(crate) use bcast::{Cursor, End, Reason, Segment};
pub use policy::{AUTO_RATIO, ShmStats, SingleCopy, single_copy_calibration};
pub(crate) use vm::allow_peer_reads;

use super::{FrameHeader, HEADER_LEN, Link, PeerInfo};
use crate::error::{Result, TransportError};
use crate::plan::BackendKind;
use memmap2::MmapRaw;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use ring::{Ring, WaitEnd};
use std::fs::File;
use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

const PAGE: usize = 4096;
const SHM_MAGIC: u64 = 0x544e_4453_484d_0002; // "TNDSHM" v2 (single-copy hand-shake)

/// Tuning of shm links.
#[derive(Debug, Clone, Copy)]
pub struct ShmOptions {
    /// Bytes per direction (rounded up to a power of two, at least 64 KiB; default 4 MiB, which
    /// stays in a shared L3 cache).
    pub ring_bytes: usize,
    /// How long a waiter spins before sleeping on the futex.
    pub spin: Duration,
    /// Largest piece the producer copies before publishing it (0 = ring/16, at most 256 KiB:
    /// small enough that the consumer reads it from cache).
    pub chunk_bytes: usize,
    /// Single-copy path for large messages: the receiver copies straight from the sender's
    /// memory with `process_vm_readv`. Falls back to the ring by itself (once, logged) where
    /// the kernel refuses. Default [`SingleCopy::Auto`].
    pub single_copy: SingleCopy,
    /// Smallest message sent by single copy (default 256 KiB). Such sends return only once the
    /// receiver has copied the message (rendezvous), like ring sends larger than the ring.
    pub single_copy_min_bytes: usize,
    /// Ring bytes of a group's shared broadcast segment (rounded up to a power of two, at least
    /// 64 KiB; default 8 MiB), made at the group's first broadcast when every pair of members
    /// is shm. 0 = no segment: broadcasts take the pipelined chain over the links. Group rank
    /// 0's value decides for the group.
    pub broadcast_bytes: usize,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            ring_bytes: 4 << 20,
            spin: Duration::from_micros(50),
            chunk_bytes: 0,
            single_copy: SingleCopy::Auto,
            single_copy_min_bytes: 256 << 10,
            broadcast_bytes: 8 << 20,
        }
    }
}

pub(crate) struct ShmLink {
    _map: MmapRaw,
    tx: Ring,
    rx: Ring,
    chunk: u64,
    sock: UnixStream,
    peer: PeerInfo,
    cma: cma::Cma,
    inbox: fdpass::Inbox,
}

impl ShmLink {
    /// Lower rank: creates the memfd, sends it (with `hello`) over `sock`, maps it.
    pub(crate) fn create(
        sock: UnixStream,
        hello: &[u8],
        opts: &ShmOptions,
        peer: PeerInfo,
    ) -> Result<Self> {
        let cap = opts.ring_bytes.max(64 << 10).next_power_of_two();
        let fd = nix::sys::memfd::memfd_create(
            c"tandem-shm-link",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .map_err(|e| TransportError::io("memfd_create for a shm link", e.into()))?;
        let file = File::from(fd);
        file.set_len((3 * PAGE + 2 * cap) as u64)
            .map_err(|e| TransportError::io("sizing the shm link memfd", e))?;
        let map = MmapRaw::map_raw(&file)
            .map_err(|e| TransportError::io("mapping the shm link memfd", e))?;
        // SAFETY: the mapping is at least 3 pages long and page-aligned; page 0 is ours alone
        // until the fd is sent below.
        unsafe {
            let p = map.as_mut_ptr() as *mut u64;
            p.write(SHM_MAGIC);
            p.add(1).write(cap as u64);
        }
        let mut msg = hello.to_vec();
        msg.extend_from_slice(&(cap as u64).to_le_bytes());
        let fds = [file.as_raw_fd()];
        sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&msg)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| TransportError::io(format!("passing the shm memfd to {peer}"), e.into()))?;
        Self::from_map(map, cap, 0, sock, opts, peer)
    }

    /// Higher rank: receives the memfd from an accepted socket; returns the peer's rank (from
    /// the hello, checked with `read_hello`) and the link.
    pub(crate) fn accept(
        sock: UnixStream,
        read_hello: &dyn Fn(&mut dyn Read) -> Result<usize>,
        opts: &ShmOptions,
        mut peer: PeerInfo,
    ) -> Result<Self> {
        let mut first = [0u8; 1];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut first)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| TransportError::io("receiving the shm memfd", e.into()))?;
        let mut fd = None;
        for c in msg
            .cmsgs()
            .map_err(|e| TransportError::io("reading SCM_RIGHTS", e.into()))?
        {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just installed `raw` in our fd table for us; we take
                    // sole ownership of it exactly once.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    fd.get_or_insert(owned);
                }
            }
        }
        if msg.bytes == 0 {
            return Err(peer.died("shm link setup"));
        }
        let mut rest = &sock;
        let mut reader = (&first[..]).chain(&mut rest);
        peer.rank = read_hello(&mut reader)?;
        let mut capb = [0u8; 8];
        reader
            .read_exact(&mut capb)
            .map_err(|e| TransportError::io("reading the shm ring size", e))?;
        let fd = fd.ok_or_else(|| TransportError::Protocol {
            peer: peer.to_string(),
            msg: "shm hello carried no memfd".into(),
        })?;
        let cap = u64::from_le_bytes(capb) as usize;
        let file = File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| TransportError::io("stat of the shm memfd", e))?
            .len();
        if !cap.is_power_of_two() || len != (3 * PAGE + 2 * cap) as u64 {
            return Err(TransportError::Protocol {
                peer: peer.to_string(),
                msg: format!("shm memfd of {len} bytes does not fit ring size {cap}"),
            });
        }
        let map = MmapRaw::map_raw(&file)
            .map_err(|e| TransportError::io("mapping the peer's shm memfd", e))?;
        // SAFETY: the mapping is `len` >= 3 pages long; page 0 was written before the fd
        // was sent and is never written again.
        let (magic, cap2) = unsafe {
            let p = map.as_ptr() as *const u64;
            (p.read(), p.add(1).read())
        };
        if magic != SHM_MAGIC || cap2 != cap as u64 {
            return Err(TransportError::Protocol {
                peer: peer.to_string(),
                msg: "shm memfd header mismatch".into(),
            });
        }
        Self::from_map(map, cap, 1, sock, opts, peer)
    }

    fn from_map(
        map: MmapRaw,
        cap: usize,
        side: usize,
        sock: UnixStream,
        opts: &ShmOptions,
        peer: PeerInfo,
    ) -> Result<Self> {
        let base = map.as_mut_ptr();
        // SAFETY: offsets are inside the 3*PAGE + 2*cap mapping checked by the callers; a
        // fresh memfd is zero-filled, which is a valid empty `Ctrl`; the mapping lives in
        // `self._map` as long as the rings.
        let (r0, r1) = unsafe {
            let ctrl0 = base.add(PAGE) as *const ring::Ctrl;
            let ctrl1 = base.add(2 * PAGE) as *const ring::Ctrl;
            let d0 = base.add(3 * PAGE);
            let d1 = base.add(3 * PAGE + cap);
            (
                Ring::new(ctrl0, d0, cap as u64, opts.spin),
                Ring::new(ctrl1, d1, cap as u64, opts.spin),
            )
        };
        let (tx, rx) = if side == 0 { (r0, r1) } else { (r1, r0) };
        sock.set_nonblocking(true)
            .map_err(|e| TransportError::io("shm liveness socket", e))?;
        let peer_pid =
            nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)
                .ok()
                .map(|c| c.pid())
                .filter(|&p| p > 0);
        Ok(ShmLink {
            cma: cma::Cma::new(opts.single_copy, opts.single_copy_min_bytes, peer_pid),
            _map: map,
            tx,
            rx,
            chunk: match opts.chunk_bytes {
                0 => (cap as u64 / 16).clamp(4096, 256 << 10),
                c => (c as u64).clamp(4096, cap as u64),
            },
            sock,
            peer,
            inbox: fdpass::Inbox::default(),
        })
    }

    /// Replaces the peer identity (the acceptor learns the rank from the hello).
    pub(crate) fn set_peer(&mut self, peer: PeerInfo) {
        self.peer = peer;
    }

    /// Hands `value` and `fd` (if any) to the peer under `tag` (see `fdpass.rs`).
    pub(crate) fn send_fd(
        &self,
        tag: u32,
        value: u64,
        fd: Option<BorrowedFd<'_>>,
        idle: Duration,
    ) -> Result<()> {
        fdpass::send(&self.sock, tag, value, fd, idle).map_err(|e| match e {
            nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET => {
                self.peer.died("passing a broadcast segment")
            }
            e => TransportError::io(
                format!("passing a broadcast segment to {}", self.peer),
                e.into(),
            ),
        })
    }

    /// Receives the peer's `send_fd` message for `tag`.
    pub(crate) fn recv_fd(&self, tag: u32, idle: Duration) -> Result<(u64, Option<OwnedFd>)> {
        let what = "receiving a broadcast segment";
        fdpass::recv(&self.sock, &self.inbox, tag, idle).map_err(|e| match e {
            fdpass::RecvEnd::Timeout => self.peer.timeout(what),
            fdpass::RecvEnd::Dead => self.peer.died(what),
            fdpass::RecvEnd::Protocol(msg) => TransportError::Protocol {
                peer: self.peer.to_string(),
                msg,
            },
        })
    }

    /// True while the peer process holds its end of the socket.
    pub(crate) fn alive(&self) -> bool {
        let mut b = [0u8; 1];
        match nix::sys::socket::recv(
            self.sock.as_raw_fd(),
            &mut b,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => false,
            Ok(_) => true,
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => true,
            Err(_) => false,
        }
    }

    fn map_end(&self, e: WaitEnd, what: &str) -> TransportError {
        match e {
            WaitEnd::Timeout => self.peer.timeout(what),
            WaitEnd::Dead => self.peer.died(what),
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        self.tx.close();
        self.rx.close();
    }
}

impl Link for ShmLink {
    fn send_frame(&self, hdr: &FrameHeader, payload: &[u8], idle: Duration) -> Result<()> {
        if self.cma.use_for(payload.len()) {
            return self.send_single_copy(hdr, payload, idle);
        }
        let alive = || self.alive();
        self.cma.ring_sent.fetch_add(payload.len() as u64, Relaxed);
        self.tx
            .write(&hdr.encode(), self.chunk, idle, &alive)
            .and_then(|()| self.tx.write(payload, self.chunk, idle, &alive))
            .map_err(|e| self.map_end(e, "send"))
    }

    fn recv_header(&self, idle: Duration) -> Result<FrameHeader, (TransportError, bool)> {
        let alive = || self.alive();
        // Waiting for the whole header first keeps a timed-out wait clean (nothing consumed).
        self.rx
            .wait_readable(HEADER_LEN as u64, idle, &alive)
            .map_err(|e| (self.map_end(e, "recv"), true))?;
        let mut b = [0u8; HEADER_LEN];
        self.rx
            .read(Some(&mut b), HEADER_LEN as u64, idle, &alive)
            .map_err(|e| (self.map_end(e, "recv"), false))?;
        let hdr = FrameHeader::decode(&b, &self.peer).map_err(|e| (e, false))?;
        if b[cma::FLAG_BYTE] == 1 {
            self.recv_desc(&hdr, idle).map_err(|e| (e, false))?;
        }
        Ok(hdr)
    }

    fn recv_payload(&self, buf: &mut [u8], idle: Duration) -> Result<()> {
        if let Some(d) = self.cma.take_pending() {
            return self.recv_single_copy(d, Some(buf), idle);
        }
        let alive = || self.alive();
        let n = buf.len() as u64;
        self.cma.ring_received.fetch_add(n, Relaxed);
        self.rx
            .read(Some(buf), n, idle, &alive)
            .map_err(|e| self.map_end(e, "recv"))
    }

    fn discard_payload(&self, len: u64, idle: Duration) -> Result<()> {
        if let Some(d) = self.cma.take_pending() {
            return self.recv_single_copy(d, None, idle);
        }
        let alive = || self.alive();
        self.rx
            .read(None, len, idle, &alive)
            .map_err(|e| self.map_end(e, "recv"))
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Shm
    }

    fn shm_stats(&self) -> Option<ShmStats> {
        Some(self.cma.stats())
    }

    fn as_shm(&self) -> Option<&ShmLink> {
        Some(self)
    }

    fn peer(&self) -> &PeerInfo {
        &self.peer
    }
}

#[cfg(test)]
mod tests {
    //! In-process checks of the ring protocol (wrap-around, streaming larger than the ring,
    //! close); the multi-process behaviour is covered by `tests/it/multiproc.rs`,
    //! `tests/it/peer_failures.rs` and `tests/it/single_copy.rs`.
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::link::MsgKey;

    fn info() -> PeerInfo {
        PeerInfo {
            rank: 1,
            addr: "test".into(),
            timeout: Duration::from_secs(10),
        }
    }

    fn pair(opts: ShmOptions) -> (ShmLink, ShmLink) {
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || ShmLink::create(a, b"hi", &opts, info()).unwrap());
        let read = |r: &mut dyn Read| {
            let mut h = [0u8; 2];
            r.read_exact(&mut h).unwrap();
            assert_eq!(&h, b"hi");
            Ok(0)
        };
        let acc = ShmLink::accept(b, &read, &opts, info()).unwrap();
        (t.join().unwrap(), acc)
    }

    #[test]
    fn frames_wrap_and_stream_through_a_small_ring() {
        let opts = ShmOptions {
            ring_bytes: 64 << 10,
            spin: Duration::from_micros(5),
            chunk_bytes: 4096,
            single_copy: SingleCopy::On,
            ..Default::default()
        };
        let (tx, rx) = pair(opts);
        let sizes: Vec<usize> = (0..60).map(|i| (i * 7919 * 13) % 300_000).collect();
        let s2 = sizes.clone();
        let idle = Duration::from_secs(10);
        let sender = std::thread::spawn(move || {
            for (i, &n) in s2.iter().enumerate() {
                let data: Vec<u8> = (0..n).map(|j| (j * 31 + i) as u8).collect();
                let key = MsgKey {
                    group: 1,
                    kind: 0,
                    tag: i as u32,
                };
                tx.send_frame(&FrameHeader { key, len: n as u64 }, &data, idle)
                    .unwrap();
            }
            tx
        });
        for (i, &n) in sizes.iter().enumerate() {
            let h = rx.recv_header(idle).map_err(|e| e.0).unwrap();
            assert_eq!((h.key.tag, h.len), (i as u32, n as u64));
            let mut buf = vec![0u8; n];
            rx.recv_payload(&mut buf, idle).unwrap();
            assert!(
                buf.iter()
                    .enumerate()
                    .all(|(j, &b)| b == (j * 31 + i) as u8)
            );
        }
        let tx = sender.join().unwrap();
        let large = sizes.iter().filter(|&&n| n >= 256 << 10).count() as u64;
        assert!(large > 0);
        assert_eq!(tx.cma.stats().single_copy_sent, large);
        assert_eq!(rx.cma.stats().single_copy_received, large);
        drop(tx);
        match rx.recv_header(idle) {
            Err((TransportError::PeerDied { rank: 0, .. }, _)) => {} // rank from the hello
            other => panic!("expected PeerDied after close, got {other:?}"),
        }
    }
}
