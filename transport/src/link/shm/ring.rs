//! Single-producer single-consumer byte ring in shared memory. The producer publishes `head`
//! (total bytes written), the consumer `tail` (total bytes read); each side sleeps on a futex
//! word after a short spin and is woken by the other side only when it announced it waits.
//!
//! Invariants: `tail <= head <= tail + cap`; only the producer writes `head` and bumps
//! `data_seq` (plus `close`); only the consumer writes `tail` and bumps `space_seq`; either
//! side may set `closed` (when its link is dropped); `cap` is a power of two.

use super::copy::copy_out;
use super::futex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// Control block of one direction, one per 4 KiB page; fields on separate cache lines.
#[repr(C)]
pub(crate) struct Ctrl {
    head: AtomicU64,
    data_seq: AtomicU32,
    consumer_waiting: AtomicU32,
    _pad0: [u8; 48],
    tail: AtomicU64,
    space_seq: AtomicU32,
    producer_waiting: AtomicU32,
    _pad1: [u8; 48],
    closed: AtomicU32,
    _pad2: [u8; 60],
    /// Single-copy (CMA) hand-shake of this direction: `seq << 3 | state` (see `cma.rs`).
    cma_state: AtomicU32,
    /// Bumped by the consumer after each piece of a single-copy read (progress for the
    /// producer's idle timeout).
    cma_progress: AtomicU32,
}

/// Why a wait ended without the condition.
pub(crate) enum WaitEnd {
    /// The deadline passed.
    Timeout,
    /// The other side closed or its process died.
    Dead,
}

/// One direction of a link, viewed from one side.
pub(crate) struct Ring {
    ctrl: *const Ctrl,
    data: *mut u8,
    cap: u64,
    spin: Duration,
}

// SAFETY: the pointers target a shared mapping owned by the enclosing link, which outlives
// the ring; all shared fields are atomics and the data area is accessed only in the byte
// ranges the SPSC protocol hands to this side (callers serialise producers and consumers).
unsafe impl Send for Ring {}
// SAFETY: see `Send`; `&Ring` methods are called by at most one producer and one consumer
// thread at a time (enforced by the link's callers holding per-direction locks).
unsafe impl Sync for Ring {}

impl Ring {
    /// # Safety
    /// `ctrl` must point to a zero-initialised or live `Ctrl` and `data` to `cap` bytes, both
    /// inside a mapping that outlives the ring; `cap` must be a power of two.
    pub(crate) unsafe fn new(ctrl: *const Ctrl, data: *mut u8, cap: u64, spin: Duration) -> Self {
        Ring {
            ctrl,
            data,
            cap,
            spin,
        }
    }

    fn c(&self) -> &Ctrl {
        // SAFETY: `ctrl` is valid for the ring's lifetime (constructor contract).
        unsafe { &*self.ctrl }
    }

    /// Bytes readable now (consumer side).
    fn readable(&self) -> u64 {
        let c = self.c();
        c.head.load(SeqCst) - c.tail.load(Relaxed)
    }

    /// Bytes writable now (producer side).
    fn writable(&self) -> u64 {
        let c = self.c();
        self.cap - (c.head.load(Relaxed) - c.tail.load(SeqCst))
    }

    /// Marks this direction closed (producer side) and wakes the consumer.
    pub(crate) fn close(&self) {
        let c = self.c();
        c.closed.store(1, SeqCst);
        c.data_seq.fetch_add(1, SeqCst);
        futex::wake_all(&c.data_seq);
        c.space_seq.fetch_add(1, SeqCst);
        futex::wake_all(&c.space_seq);
    }

    pub(crate) fn closed(&self) -> bool {
        self.c().closed.load(SeqCst) != 0
    }

    /// The single-copy hand-shake word of this direction.
    pub(crate) fn cma_state(&self) -> &AtomicU32 {
        &self.c().cma_state
    }

    /// The single-copy progress counter of this direction.
    pub(crate) fn cma_progress(&self) -> &AtomicU32 {
        &self.c().cma_progress
    }

    /// The waiter's spin budget.
    pub(crate) fn spin(&self) -> Duration {
        self.spin
    }

    /// Producer: copies `src` into the ring, publishing at most `chunk` bytes at a time.
    pub(crate) fn write(
        &self,
        mut src: &[u8],
        chunk: u64,
        idle: Duration,
        alive: &dyn Fn() -> bool,
    ) -> Result<(), WaitEnd> {
        let c = self.c();
        while !src.is_empty() {
            let mut free = self.writable();
            if free == 0 {
                self.wait(true, 1, idle, alive)?;
                free = self.writable();
            }
            let n = free.min(src.len() as u64).min(chunk) as usize;
            let head = c.head.load(Relaxed);
            let at = (head & (self.cap - 1)) as usize;
            let first = n.min(self.cap as usize - at);
            // SAFETY: [at, at+first) and [0, n-first) lie inside the data area and are free
            // (not readable by the consumer until `head` is published below).
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(at), first);
                std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data, n - first);
            }
            c.head.store(head + n as u64, SeqCst);
            if c.consumer_waiting.load(SeqCst) != 0 {
                c.data_seq.fetch_add(1, SeqCst);
                futex::wake_all(&c.data_seq);
            }
            src = &src[n..];
        }
        Ok(())
    }

    /// Consumer: waits until at least `need` bytes are readable.
    pub(crate) fn wait_readable(
        &self,
        need: u64,
        idle: Duration,
        alive: &dyn Fn() -> bool,
    ) -> Result<(), WaitEnd> {
        self.wait(false, need, idle, alive)
    }

    /// Consumer: copies `dst.len()` bytes out (or drops them when `dst` is `None`).
    pub(crate) fn read(
        &self,
        mut dst: Option<&mut [u8]>,
        mut len: u64,
        idle: Duration,
        alive: &dyn Fn() -> bool,
    ) -> Result<(), WaitEnd> {
        let c = self.c();
        let mut off = 0usize;
        while len > 0 {
            let mut avail = self.readable();
            if avail == 0 {
                self.wait(false, 1, idle, alive)?;
                avail = self.readable();
            }
            let n = avail.min(len) as usize;
            let tail = c.tail.load(Relaxed);
            let at = (tail & (self.cap - 1)) as usize;
            let first = n.min(self.cap as usize - at);
            if let Some(d) = dst.as_deref_mut() {
                let stream = d.len() >= super::copy::STREAM_MIN;
                let out = &mut d[off..off + n];
                // SAFETY: [at, at+first) and [0, n-first) are inside the data area and were
                // published by the producer (n <= readable), so it no longer writes them;
                // `out` is our own buffer of n bytes.
                unsafe {
                    copy_out(self.data.add(at), out.as_mut_ptr(), first, stream);
                    copy_out(self.data, out.as_mut_ptr().add(first), n - first, stream);
                }
            }
            c.tail.store(tail + n as u64, SeqCst);
            if c.producer_waiting.load(SeqCst) != 0 {
                c.space_seq.fetch_add(1, SeqCst);
                futex::wake_all(&c.space_seq);
            }
            off += n;
            len -= n as u64;
        }
        Ok(())
    }

    /// Spins briefly, then sleeps on the futex until `need` bytes are readable (consumer) or
    /// any space is free (producer), `idle` passes without that, or the peer is gone.
    fn wait(
        &self,
        producer: bool,
        need: u64,
        idle: Duration,
        alive: &dyn Fn() -> bool,
    ) -> Result<(), WaitEnd> {
        let deadline = Instant::now() + idle;
        let ready = || {
            if producer {
                self.writable() >= need
            } else {
                self.readable() >= need
            }
        };
        futex::spin(self.spin, ready);
        let c = self.c();
        let (seq, flag) = if producer {
            (&c.space_seq, &c.producer_waiting)
        } else {
            (&c.data_seq, &c.consumer_waiting)
        };
        loop {
            flag.store(1, SeqCst);
            let s = seq.load(SeqCst);
            if ready() {
                flag.store(0, SeqCst);
                return Ok(());
            }
            if self.closed() {
                flag.store(0, SeqCst);
                return Err(WaitEnd::Dead);
            }
            let now = Instant::now();
            if now >= deadline {
                flag.store(0, SeqCst);
                return Err(WaitEnd::Timeout);
            }
            futex::wait(seq, s, (deadline - now).min(Duration::from_millis(50)));
            flag.store(0, SeqCst);
            if ready() {
                return Ok(());
            }
            if !alive() {
                return Err(WaitEnd::Dead);
            }
        }
    }
}
