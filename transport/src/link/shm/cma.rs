//! Single-copy path for large messages ("cross memory attach", as MPI libraries do on one
//! host). Instead of the payload, the sender writes a 32-byte descriptor `{pid, seq, addr,
//! len}` after the frame header (header byte [`FLAG_BYTE`] = 1) and waits; the receiver
//! copies straight from the sender's address space into the destination buffer with
//! `process_vm_readv` (one kernel-assisted copy instead of two through the ring) and acks.
//!
//! Hand-shake, on the direction's shared word `cma_state = seq << 3 | state`:
//! sender stores `POSTED` before writing the descriptor; the receiver moves it
//! `POSTED -> CLAIMED` before reading and `CLAIMED -> DONE | FALLBACK | FAILED` after;
//! a sender that gives up (timeout) swaps in `CANCELLED`, so a receiver still reading fails
//! its final compare-exchange and reports an error instead of delivering bytes the sender may
//! already have reused. The sender's buffer stays borrowed until a final state is seen.
//!
//! Fallback: when the kernel refuses the read (EPERM: ptrace policy; ENOSYS) or the
//! receiver's options disable the path, the receiver answers `FALLBACK`, the sender then
//! streams the payload through the ring and stops posting descriptors on that link (logged
//! once per process). A sender that dies mid-read makes the read fail with ESRCH, reported as
//! `PeerDied`.

use super::policy::{ShmStats, SingleCopy, auto_decision};
use super::{ShmLink, futex, vm};
use crate::error::{Result, TransportError};
use crate::link::{FrameHeader, HEADER_LEN};
use nix::errno::Errno;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Header byte that marks a descriptor frame (bytes 24..32 of the header are backend-owned).
pub(crate) const FLAG_BYTE: usize = 24;
/// Encoded descriptor size.
pub(crate) const DESC_LEN: usize = 32;

const POSTED: u32 = 0;
const CLAIMED: u32 = 1;
const DONE: u32 = 2;
const FALLBACK: u32 = 3;
const CANCELLED: u32 = 4;
const FAILED: u32 = 5;
const SEQ_MASK: u32 = (1 << 29) - 1;

/// Largest piece per `process_vm_readv` call; progress is published after each.
const PIECE: usize = 32 << 20;

fn word(seq: u32, state: u32) -> u32 {
    ((seq & SEQ_MASK) << 3) | state
}

/// Where the sender's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Desc {
    pid: i32,
    seq: u32,
    addr: u64,
    len: u64,
}

impl Desc {
    fn encode(&self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[0..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    fn decode(b: &[u8; DESC_LEN]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        Desc {
            pid: u32_at(0) as i32,
            seq: u32_at(4),
            addr: u64_at(8),
            len: u64_at(16),
        }
    }
}

/// Per-link single-copy state.
pub(crate) struct Cma {
    /// Post descriptors for messages of at least `min_bytes` (cleared after a fallback).
    send_on: AtomicBool,
    /// Try `process_vm_readv` for incoming descriptors (cleared after EPERM/ENOSYS).
    recv_on: AtomicBool,
    min_bytes: u64,
    seq: AtomicU32,
    /// The peer's pid from SO_PEERCRED (namespace-correct); replaces the descriptor's pid.
    peer_pid: Option<i32>,
    /// Descriptor of the frame whose header was just received.
    pending: Mutex<Option<Desc>>,
    sent: AtomicU64,
    received: AtomicU64,
    bytes_received: AtomicU64,
    pub(super) ring_sent: AtomicU64,
    pub(super) ring_received: AtomicU64,
    fallbacks: AtomicU64,
}

/// Logs the first fallback of this process only.
static LOGGED: AtomicBool = AtomicBool::new(false);

fn log_fallback_once(why: &str) {
    if !LOGGED.swap(true, SeqCst) {
        tracing::warn!(
            "tandem-transport: single-copy shm path unavailable ({why}); large messages go through the shm ring (two copies)"
        );
    }
}

impl Cma {
    pub(crate) fn new(mode: SingleCopy, min_bytes: usize, peer_pid: Option<i32>) -> Self {
        let send = match mode {
            SingleCopy::On => true,
            SingleCopy::Off => false,
            SingleCopy::Auto => auto_decision(),
        };
        Cma {
            send_on: AtomicBool::new(send),
            recv_on: AtomicBool::new(mode != SingleCopy::Off),
            min_bytes: (min_bytes as u64).max(1),
            seq: AtomicU32::new(1),
            peer_pid,
            pending: Mutex::new(None),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            ring_sent: AtomicU64::new(0),
            ring_received: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> ShmStats {
        ShmStats {
            single_copy_sent: self.sent.load(Relaxed),
            single_copy_received: self.received.load(Relaxed),
            single_copy_bytes_received: self.bytes_received.load(Relaxed),
            ring_bytes_sent: self.ring_sent.load(Relaxed),
            ring_bytes_received: self.ring_received.load(Relaxed),
            fallbacks: self.fallbacks.load(Relaxed),
            ..ShmStats::default()
        }
    }

    pub(crate) fn use_for(&self, len: usize) -> bool {
        len as u64 >= self.min_bytes && self.send_on.load(Relaxed)
    }

    pub(crate) fn take_pending(&self) -> Option<Desc> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl ShmLink {
    /// Sender: posts a descriptor of `payload` and waits until the receiver copied it (or
    /// asked for the ring, or failed). `payload` stays borrowed, unmodified, until then.
    pub(crate) fn send_single_copy(
        &self,
        hdr: &FrameHeader,
        payload: &[u8],
        idle: Duration,
    ) -> Result<()> {
        let alive = || self.alive();
        let seq = self.cma.seq.fetch_add(1, Relaxed) & SEQ_MASK;
        let st = self.tx.cma_state();
        st.store(word(seq, POSTED), SeqCst);
        let desc = Desc {
            pid: std::process::id() as i32,
            seq,
            addr: payload.as_ptr() as u64,
            len: payload.len() as u64,
        };
        let mut b = [0u8; HEADER_LEN + DESC_LEN];
        b[..HEADER_LEN].copy_from_slice(&hdr.encode());
        b[FLAG_BYTE] = 1;
        b[HEADER_LEN..].copy_from_slice(&desc.encode());
        self.tx
            .write(&b, self.chunk, idle, &alive)
            .map_err(|e| self.map_end(e, "send"))?;
        match self.wait_ack(seq, idle)? {
            DONE => {
                self.cma.sent.fetch_add(1, Relaxed);
                Ok(())
            }
            FALLBACK => {
                self.cma.send_on.store(false, Relaxed);
                log_fallback_once(&format!("{} did not read this process's memory", self.peer));
                self.cma.ring_sent.fetch_add(payload.len() as u64, Relaxed);
                self.tx
                    .write(payload, self.chunk, idle, &alive)
                    .map_err(|e| self.map_end(e, "send"))
            }
            _ => Err(TransportError::Protocol {
                peer: self.peer.to_string(),
                msg: "the receiver failed to read a large message from this process (see its \
                      log); set ShmOptions::single_copy to SingleCopy::Off to use the ring only"
                    .into(),
            }),
        }
    }

    /// Sender: spins, then sleeps on the hand-shake word until a final state for `seq`.
    fn wait_ack(&self, seq: u32, idle: Duration) -> Result<u32> {
        let st = self.tx.cma_state();
        let progress = self.tx.cma_progress();
        let done = |v: u32| v >> 3 == seq && matches!(v & 7, DONE | FALLBACK | FAILED);
        futex::spin(self.tx.spin(), || done(st.load(SeqCst)));
        let mut seen = progress.load(SeqCst);
        let mut deadline = Instant::now() + idle;
        loop {
            let v = st.load(SeqCst);
            if done(v) {
                return Ok(v & 7);
            }
            let p = progress.load(SeqCst);
            if p != seen {
                seen = p;
                deadline = Instant::now() + idle;
            }
            let dead = self.tx.closed() || !self.alive();
            let now = Instant::now();
            if dead || now >= deadline {
                // Withdraw the buffer; a receiver still reading will see CANCELLED and fail.
                let prev = st.swap(word(seq, CANCELLED), SeqCst);
                if done(prev) {
                    st.store(prev, SeqCst);
                    return Ok(prev & 7);
                }
                return Err(if dead {
                    self.peer.died("send (single-copy hand-off)")
                } else {
                    self.peer.timeout("send (single-copy hand-off)")
                });
            }
            futex::wait(st, v, (deadline - now).min(Duration::from_millis(50)));
        }
    }

    /// Receiver: reads the descriptor that follows a flagged header.
    pub(crate) fn recv_desc(&self, hdr: &FrameHeader, idle: Duration) -> Result<()> {
        let alive = || self.alive();
        let mut b = [0u8; DESC_LEN];
        self.rx
            .read(Some(&mut b), DESC_LEN as u64, idle, &alive)
            .map_err(|e| self.map_end(e, "recv"))?;
        let mut d = Desc::decode(&b);
        if d.len != hdr.len {
            return Err(TransportError::Protocol {
                peer: self.peer.to_string(),
                msg: format!(
                    "single-copy descriptor of {} bytes in a frame of {} bytes",
                    d.len, hdr.len
                ),
            });
        }
        // The socket's peer pid is the sender as seen from this pid namespace.
        if let Some(p) = self.cma.peer_pid {
            d.pid = p;
        }
        *self
            .cma
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(d);
        Ok(())
    }

    /// Receiver: completes a descriptor frame: copies it into `dst` (single copy, or through
    /// the ring after a fallback) or, with `None`, drops it.
    pub(crate) fn recv_single_copy(
        &self,
        d: Desc,
        dst: Option<&mut [u8]>,
        idle: Duration,
    ) -> Result<()> {
        let st = self.rx.cma_state();
        let finish = |state: u32| {
            let ok = st
                .compare_exchange(word(d.seq, CLAIMED), word(d.seq, state), SeqCst, SeqCst)
                .is_ok();
            futex::wake_all(st);
            ok
        };
        let cancelled = || TransportError::Protocol {
            peer: self.peer.to_string(),
            msg: "the sender withdrew a large message (its send timed out) while this receive \
                  was taking it; raise the transport timeout"
                .into(),
        };
        if st
            .compare_exchange(word(d.seq, POSTED), word(d.seq, CLAIMED), SeqCst, SeqCst)
            .is_err()
        {
            return Err(cancelled());
        }
        let Some(buf) = dst else {
            return if finish(DONE) {
                Ok(())
            } else {
                Err(cancelled())
            };
        };
        if buf.len() as u64 != d.len {
            finish(FAILED);
            return Err(TransportError::Protocol {
                peer: self.peer.to_string(),
                msg: format!("receive of {} bytes for a {}-byte frame", buf.len(), d.len),
            });
        }
        if self.cma.recv_on.load(Relaxed) {
            match self.read_remote(d, buf) {
                Ok(()) => {
                    if !finish(DONE) {
                        return Err(cancelled());
                    }
                    self.cma.received.fetch_add(1, Relaxed);
                    self.cma.bytes_received.fetch_add(d.len, Relaxed);
                    return Ok(());
                }
                Err(Errno::ESRCH) => return Err(self.peer.died("recv (single-copy read)")),
                Err(e @ (Errno::EPERM | Errno::ENOSYS)) => {
                    self.cma.recv_on.store(false, Relaxed);
                    log_fallback_once(&format!("process_vm_readv from {}: {e}", self.peer));
                }
                Err(e) => {
                    finish(FAILED);
                    return Err(TransportError::io(
                        format!(
                            "reading {} bytes from {}'s memory with process_vm_readv",
                            d.len, self.peer
                        ),
                        std::io::Error::from(e),
                    ));
                }
            }
        }
        self.cma.fallbacks.fetch_add(1, Relaxed);
        if !finish(FALLBACK) {
            return Err(cancelled());
        }
        let alive = || self.alive();
        self.cma.ring_received.fetch_add(d.len, Relaxed);
        self.rx
            .read(Some(buf), d.len, idle, &alive)
            .map_err(|e| self.map_end(e, "recv"))
    }

    /// Copies the whole message in pieces, publishing progress after each.
    fn read_remote(&self, d: Desc, buf: &mut [u8]) -> Result<(), Errno> {
        let mut off = 0usize;
        while off < buf.len() {
            let end = buf.len().min(off + PIECE);
            let n = vm::read_from(d.pid, d.addr + off as u64, &mut buf[off..end])?;
            if n == 0 {
                return Err(Errno::EFAULT);
            }
            off += n;
            self.rx.cma_progress().fetch_add(1, SeqCst);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Descriptor encoding and the ESRCH mapping of the syscall layer.
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn descriptor_round_trips() {
        let d = Desc {
            pid: 4242,
            seq: 7,
            addr: 0x7fff_1234_5678,
            len: 1 << 30,
        };
        assert_eq!(Desc::decode(&d.encode()), d);
        assert_eq!(word(SEQ_MASK + 3, DONE), word(2, DONE));
    }

    #[test]
    fn reading_a_reaped_process_is_esrch() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id() as i32;
        c.wait().unwrap();
        let mut b = [0u8; 16];
        assert_eq!(vm::read_from(pid, 4096, &mut b), Err(Errno::ESRCH));
    }

    #[test]
    fn reading_own_memory_copies() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let n = vm::read_from(std::process::id() as i32, src.as_ptr() as u64, &mut dst).unwrap();
        assert_eq!(n, src.len());
        assert_eq!(dst, src);
    }
}
