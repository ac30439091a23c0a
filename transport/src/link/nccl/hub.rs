//! The NCCL link's progress engine, free of CUDA so that it runs (and is tested) on a CPU.
//!
//! Every NCCL pair of a world is a byte pipe per direction. Callers only copy bytes into and
//! out of those pipes; ONE worker thread per world (per [`start`]) issues every NCCL call. It
//! walks the world's pairs in a fixed global order, the order of (lower rank, higher rank),
//! and does one *round* per pair per walk, whether or not anything is pending. A round is one
//! exchange on the pair's only communicator: both sides send a 32-byte control block plus the
//! bytes they announced in the previous round and receive the same from the other side
//! ([`Wire::exchange`], on the GPU a grouped `ncclSend` + `ncclRecv`), so both sides always
//! issue the same operations, in the same order, with matching sizes, one at a time:
//!
//! - one NCCL operation in flight per process (NCCL's rule for several communicators on one
//!   device), and no two ranks can wait on each other in a cycle: every rank walks a
//!   subsequence of one total order of pairs, so the smallest pair anyone waits on has both
//!   sides waiting on it and completes;
//! - a control block carries: the bytes the sender will send next round (at most [`CHUNK`]),
//!   the receiver's credit (total bytes the peer may ever announce: bytes the reader took +
//!   [`IN_CAP`]), and a CLOSE flag. Stale credits are only conservative, so the incoming pipe
//!   never holds more than `IN_CAP`;
//! - after a walk in which nothing moved, the worker waits (20 µs doubling to [`IDLE_MAX`], cut
//!   short by a local send or read) before the next walk; the peer waits for it in its round;
//! - dropping the world sets `closing`: each pair sends CLOSE once its outgoing pipe is empty
//!   and both sides retire the pair after that round; the worker exits when no pair is left.

use crate::error::{Result, TransportError};
use crate::link::PeerInfo;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Control block at the head of every round's message.
pub(super) const CTRL: usize = 32;
/// Most payload bytes one side sends in one round (the device staging buffers hold
/// `CTRL + CHUNK`).
pub(super) const CHUNK: usize = 8 << 20;
/// A sender blocks while its outgoing pipe holds this much.
const OUT_CAP: usize = 2 * CHUNK;
/// Most bytes the incoming pipe holds (the credit a receiver gives).
const IN_CAP: u64 = 2 * CHUNK as u64;
/// Longest wait between idle walks.
const IDLE_MAX: Duration = Duration::from_millis(1);
const FLAG_CLOSE: u64 = 1;

/// Why a pair stopped.
#[derive(Debug, Clone)]
pub(super) enum Stop {
    /// This side's world was dropped.
    Closed,
    /// The peer's world was dropped (it sent CLOSE).
    PeerClosed,
    /// The peer died or its connection broke (NCCL reported a remote or system error).
    PeerDied(String),
    /// A CUDA/NCCL error or a protocol violation.
    Failed(String),
}

impl Stop {
    fn error(&self, peer: &PeerInfo, what: &str) -> TransportError {
        match self {
            Stop::Closed => TransportError::Invalid(format!(
                "the NCCL link to rank {} was used after its world was dropped",
                peer.rank
            )),
            Stop::PeerClosed => peer.died(&format!("{what} (it dropped its world)")),
            Stop::PeerDied(m) => peer.died(&format!("{what} (NCCL: {m})")),
            Stop::Failed(m) => TransportError::Device {
                rank: peer.rank,
                msg: m.clone(),
            },
        }
    }
}

/// One exchange per round; both sides call it with each other's lengths.
pub(super) trait Wire {
    /// Sends `out` to pair `i`'s peer and receives exactly `inb.len()` bytes from it; returns
    /// when both directions completed.
    fn exchange(&mut self, i: usize, out: &[u8], inb: &mut [u8]) -> std::result::Result<(), Stop>;
    /// Releases pair `i` (its communicator); called once, after its last round.
    fn retire(&mut self, i: usize);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
struct PipeState {
    buf: VecDeque<u8>,
    /// Bytes readers took so far (incoming pipe: the credit's base).
    taken: u64,
    stop: Option<Stop>,
}

#[derive(Default)]
struct Pipe {
    st: Mutex<PipeState>,
    cv: Condvar,
}

impl Pipe {
    fn stop(&self, why: &Stop) {
        let mut g = lock(&self.st);
        if g.stop.is_none() {
            g.stop = Some(why.clone());
        }
        self.cv.notify_all();
    }
}

/// One pair's two pipes, shared by its link and the worker.
#[derive(Default)]
pub(super) struct Pair {
    out: Pipe,
    inp: Pipe,
}

#[derive(Default)]
struct HubState {
    closing: bool,
    kicks: u64,
    done: bool,
}

#[derive(Default)]
struct Hub {
    st: Mutex<HubState>,
    cv: Condvar,
}

impl Hub {
    fn kick(&self) {
        lock(&self.st).kicks += 1;
        self.cv.notify_all();
    }
}

/// Owned by a world's NCCL links; the last one dropped closes every pair and waits (up to
/// `linger`) for the worker to finish, so bytes already sent are delivered first.
pub(super) struct HubHandle {
    hub: Arc<Hub>,
    thread: Mutex<Option<JoinHandle<()>>>,
    linger: Duration,
}

impl HubHandle {
    fn kick(&self) {
        self.hub.kick();
    }
}

impl Drop for HubHandle {
    fn drop(&mut self) {
        let deadline = Instant::now() + self.linger;
        let mut g = lock(&self.hub.st);
        g.closing = true;
        self.hub.cv.notify_all();
        while !g.done {
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(
                    "tandem-transport: the NCCL worker did not finish closing within {:?}; \
                     leaving it behind",
                    self.linger
                );
                return;
            }
            g = self
                .hub
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(g);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

/// Starts a world's worker: `make` builds the wire on the worker thread (so every CUDA and
/// NCCL call happens there); returns once it did, with one pair per entry of `n_pairs`, in
/// the global pair order the wire was built in.
pub(super) fn start<W, F>(
    make: F,
    n_pairs: usize,
    linger: Duration,
) -> Result<(Arc<HubHandle>, Vec<Arc<Pair>>)>
where
    W: Wire,
    F: FnOnce() -> Result<W> + Send + 'static,
{
    let hub = Arc::new(Hub::default());
    let pairs: Vec<Arc<Pair>> = (0..n_pairs).map(|_| Arc::default()).collect();
    let (tx, rx) = mpsc::channel();
    let (h, p) = (Arc::clone(&hub), pairs.clone());
    let thread = std::thread::Builder::new()
        .name("tandem-nccl".into())
        .spawn(move || match make() {
            Ok(wire) => {
                let _ = tx.send(Ok(()));
                run(wire, &h, &p);
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                lock(&h.st).done = true;
            }
        })
        .map_err(|e| TransportError::io("starting the NCCL worker thread", e))?;
    match rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(TransportError::Invalid(
                "the NCCL worker thread panicked while setting up its communicators".into(),
            ));
        }
    }
    let handle = HubHandle {
        hub,
        thread: Mutex::new(Some(thread)),
        linger,
    };
    Ok((Arc::new(handle), pairs))
}

/// Per-pair round state on the worker.
struct Round {
    /// Bytes this side sends this round (announced last round).
    out_now: usize,
    /// Bytes the peer sends this round.
    in_now: usize,
    /// Total bytes this side announced so far.
    committed: u64,
    /// The peer's latest credit.
    peer_limit: u64,
    live: bool,
}

fn run<W: Wire>(mut wire: W, hub: &Hub, pairs: &[Arc<Pair>]) {
    let mut rounds: Vec<Round> = (0..pairs.len())
        .map(|_| Round {
            out_now: 0,
            in_now: 0,
            committed: 0,
            peer_limit: IN_CAP,
            live: true,
        })
        .collect();
    let mut out = vec![0u8; CTRL + CHUNK];
    let mut inb = vec![0u8; CTRL + CHUNK];
    let mut backoff = Duration::ZERO;
    loop {
        let (closing, seen) = {
            let g = lock(&hub.st);
            (g.closing, g.kicks)
        };
        let (mut moved, mut live) = (false, false);
        for (i, (pair, r)) in pairs.iter().zip(&mut rounds).enumerate() {
            if r.live {
                live = true;
                moved |= round(&mut wire, i, pair, r, closing, &mut out, &mut inb);
            }
        }
        if !live {
            break;
        }
        if moved {
            backoff = Duration::ZERO;
            continue;
        }
        backoff = (backoff * 2).clamp(Duration::from_micros(20), IDLE_MAX);
        let g = lock(&hub.st);
        if g.kicks == seen && g.closing == closing {
            drop(hub.cv.wait_timeout(g, backoff));
        }
    }
    drop(wire);
    lock(&hub.st).done = true;
    hub.cv.notify_all();
}

/// One round with pair `i`; true when any byte moved or was announced.
fn round<W: Wire>(
    wire: &mut W,
    i: usize,
    pair: &Pair,
    r: &mut Round,
    closing: bool,
    out: &mut [u8],
    inb: &mut [u8],
) -> bool {
    let (next, pending) = {
        let g = lock(&pair.out.st);
        let credit = usize::try_from(r.peer_limit - r.committed).unwrap_or(usize::MAX);
        let next = (g.buf.len() - r.out_now).min(CHUNK).min(credit);
        let (a, b) = g.buf.as_slices();
        let na = a.len().min(r.out_now);
        out[CTRL..CTRL + na].copy_from_slice(&a[..na]);
        out[CTRL + na..CTRL + r.out_now].copy_from_slice(&b[..r.out_now - na]);
        (next, g.buf.len())
    };
    let limit = lock(&pair.inp.st).taken + IN_CAP;
    let close = closing && pending == 0;
    out[0..8].copy_from_slice(&(next as u64).to_le_bytes());
    out[8..16].copy_from_slice(&limit.to_le_bytes());
    out[16..24].copy_from_slice(&(if close { FLAG_CLOSE } else { 0 }).to_le_bytes());
    out[24..CTRL].fill(0);
    let (sent, got) = (r.out_now, r.in_now);
    if let Err(why) = wire.exchange(i, &out[..CTRL + sent], &mut inb[..CTRL + got]) {
        retire(wire, i, pair, r, &why);
        return true;
    }
    if sent > 0 {
        let mut g = lock(&pair.out.st);
        g.buf.drain(..sent);
        g.taken += sent as u64;
        pair.out.cv.notify_all();
    }
    if got > 0 {
        let mut g = lock(&pair.inp.st);
        g.buf.extend(&inb[CTRL..CTRL + got]);
        pair.inp.cv.notify_all();
    }
    let word = |k: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&inb[k * 8..k * 8 + 8]);
        u64::from_le_bytes(w)
    };
    let (peer_next, peer_limit, peer_flags) = (word(0), word(1), word(2));
    if peer_next > CHUNK as u64 {
        let why = Stop::Failed(format!(
            "NCCL link protocol: the peer announced {peer_next} bytes, over the {CHUNK}-byte chunk"
        ));
        retire(wire, i, pair, r, &why);
        return true;
    }
    r.committed += next as u64;
    r.out_now = next;
    r.in_now = peer_next as usize;
    r.peer_limit = r.peer_limit.max(peer_limit);
    if close {
        retire(wire, i, pair, r, &Stop::Closed);
    } else if peer_flags & FLAG_CLOSE != 0 {
        retire(wire, i, pair, r, &Stop::PeerClosed);
    }
    sent > 0 || got > 0 || next > 0 || peer_next > 0
}

fn retire<W: Wire>(wire: &mut W, i: usize, pair: &Pair, r: &mut Round, why: &Stop) {
    pair.out.stop(why);
    pair.inp.stop(why);
    r.live = false;
    wire.retire(i);
}

/// The caller side of a pair: what `NcclLink` does with its pipes.
impl Pair {
    /// Appends `data` to the outgoing pipe, waiting while it is full; `Timeout` after `idle`
    /// without room.
    pub(super) fn write(
        &self,
        hub: &HubHandle,
        mut data: &[u8],
        idle: Duration,
        peer: &PeerInfo,
    ) -> Result<()> {
        while !data.is_empty() {
            let mut g = lock(&self.out.st);
            let deadline = Instant::now() + idle;
            loop {
                if let Some(why) = &g.stop {
                    return Err(why.error(peer, "an NCCL send"));
                }
                if g.buf.len() < OUT_CAP {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(peer.timeout("an NCCL send (the peer is not receiving)"));
                }
                g = self
                    .out
                    .cv
                    .wait_timeout(g, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            let n = (OUT_CAP - g.buf.len()).min(data.len());
            g.buf.extend(&data[..n]);
            data = &data[n..];
            drop(g);
            hub.kick();
        }
        Ok(())
    }

    /// Fills `buf` from the incoming pipe. `whole`: take nothing until all of `buf` is there
    /// (then a `Timeout` consumed nothing). `Timeout` after `idle` without a new byte.
    pub(super) fn read(
        &self,
        hub: &HubHandle,
        buf: &mut [u8],
        whole: bool,
        idle: Duration,
        peer: &PeerInfo,
    ) -> Result<()> {
        let mut done = 0;
        let mut g = lock(&self.inp.st);
        let mut deadline = Instant::now() + idle;
        while done < buf.len() {
            let need = if whole { buf.len() } else { 1 };
            if g.buf.len() >= need {
                let n = g.buf.len().min(buf.len() - done);
                let (a, b) = g.buf.as_slices();
                let na = a.len().min(n);
                buf[done..done + na].copy_from_slice(&a[..na]);
                buf[done + na..done + n].copy_from_slice(&b[..n - na]);
                g.buf.drain(..n);
                g.taken += n as u64;
                done += n;
                deadline = Instant::now() + idle;
                drop(g);
                hub.kick();
                g = lock(&self.inp.st);
                continue;
            }
            if let Some(why) = &g.stop {
                return Err(why.error(peer, "an NCCL receive"));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(peer.timeout("an NCCL receive"));
            }
            g = self
                .inp
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }
}
