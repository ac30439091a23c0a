//! The broadcast protocol on a mapped [`Segment`]: the root's `publish`, a receiver's
//! `receive`, and the bounded waits both sides run (see the parent module for the rules).

use super::super::copy::STREAM_MIN;
use super::super::futex;
use super::{Cursor, End, FRAME_MAGIC, LINE, SLICE, Segment, round_up};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

impl Segment {
    /// Root: sends `src` as broadcast `cur.seq + 1` from this member (`root_id` is written
    /// into the frame header so receivers can check who sent it). `alive(r)` says whether
    /// group rank `r` still runs.
    pub(crate) fn publish(
        &self,
        cur: &mut Cursor,
        root_id: u64,
        src: &[u8],
        idle: Duration,
        alive: &dyn Fn(usize) -> bool,
    ) -> Result<(), End> {
        self.check_abort()?;
        let c = self.ctrl();
        let seq = cur.seq + 1;
        if let Err(w) = c.claim.compare_exchange(cur.seq, seq, SeqCst, SeqCst) {
            return Err(End::Protocol(format!(
                "broadcast {seq} of this group was already claimed (claim word {w}): members \
                 disagree on the root or on the number of broadcasts"
            )));
        }
        let len = src.len() as u64;
        let span = round_up(len);
        let mut hdr = [0u8; LINE as usize];
        for (i, v) in [FRAME_MAGIC, root_id, seq, len].into_iter().enumerate() {
            hdr[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        let chunk = self.chunk;
        let mut pos = cur.pos;
        self.wait_space(pos + LINE, idle, alive)?;
        // SAFETY: wait_space made [pos, pos + 64) free of readers; 64 <= cap.
        unsafe { self.put(pos, &hdr) };
        pos += LINE;
        let mut off = 0u64;
        loop {
            if off < span {
                let mut free = self.free(pos);
                if free == 0 {
                    // Wait for a whole piece: fewer, larger copies and fewer sleeps.
                    self.publish_head(pos);
                    self.wait_space(pos + chunk.min(span - off), idle, alive)?;
                    free = self.free(pos);
                }
                let n = free.min(chunk).min(span - off);
                let real = &src[(off.min(len)) as usize..((off + n).min(len)) as usize];
                // SAFETY: [pos, pos + n) is free (n <= free) and n <= cap; the copied bytes
                // are at most n.
                unsafe { self.put(pos, real) };
                pos += n;
                off += n;
            }
            self.publish_head(pos);
            if off == span {
                break;
            }
        }
        *cur = Cursor { pos, seq };
        Ok(())
    }

    /// Receiver: receives broadcast `cur.seq + 1` from group rank `root` (whose header must
    /// carry `root_id`) into `dst`. Returns the root's length; when it differs from
    /// `dst.len()` the frame is consumed without copying and `dst` is left untouched.
    pub(crate) fn receive(
        &self,
        cur: &mut Cursor,
        root: usize,
        root_id: u64,
        dst: &mut [u8],
        idle: Duration,
        alive: &dyn Fn(usize) -> bool,
    ) -> Result<u64, End> {
        self.check_abort()?;
        let seq = cur.seq + 1;
        let mut pos = cur.pos;
        self.wait_data(pos + LINE, root, idle, alive)?;
        let mut hdr = [0u8; LINE as usize];
        // SAFETY: the header line is published (head >= pos + 64) and not released yet.
        unsafe { self.get(pos, &mut hdr, false) };
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&hdr[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        let (magic, from, hseq, len) = (word(0), word(1), word(2), word(3));
        if magic != FRAME_MAGIC || hseq != seq || from != root_id {
            return Err(End::Protocol(format!(
                "broadcast {seq} from root id {root_id}: the segment holds frame {hseq} from \
                 root id {from} (magic {magic:#x}); members disagree on the root or on the \
                 number of broadcasts"
            )));
        }
        let span = round_up(len);
        let copy = len == dst.len() as u64;
        let stream = copy && dst.len() >= STREAM_MIN;
        let piece = self.chunk * 2;
        pos += LINE;
        let mut off = 0u64;
        loop {
            if off < span {
                let mut avail = self.ctrl().head.load(SeqCst).saturating_sub(pos);
                if avail == 0 {
                    self.release(pos);
                    self.wait_data(pos + LINE, root, idle, alive)?;
                    avail = self.ctrl().head.load(SeqCst).saturating_sub(pos);
                }
                let n = avail.min(piece).min(span - off);
                if copy {
                    let (a, b) = (off.min(len) as usize, (off + n).min(len) as usize);
                    // SAFETY: [pos, pos + n) is published (n <= head - pos) and ours until
                    // the tail store below; the copied part is at most n bytes.
                    unsafe { self.get(pos, &mut dst[a..b], stream) };
                }
                pos += n;
                off += n;
            }
            self.release(pos);
            if off == span {
                break;
            }
        }
        *cur = Cursor { pos, seq };
        Ok(len)
    }

    /// Ring bytes the root may write at `pos` now.
    fn free(&self, pos: u64) -> u64 {
        let oldest = (0..self.members)
            .filter(|&r| r != self.me)
            .map(|r| self.tail(r).load(SeqCst))
            .min()
            .unwrap_or(pos);
        self.cap.saturating_sub(pos.saturating_sub(oldest))
    }

    fn publish_head(&self, pos: u64) {
        let c = self.ctrl();
        c.head.store(pos, SeqCst);
        self.tail(self.me).store(pos, SeqCst);
        if c.data_waiters.load(SeqCst) != 0 {
            c.data_seq.fetch_add(1, SeqCst);
            futex::wake_all(&c.data_seq);
        }
    }

    fn release(&self, pos: u64) {
        let c = self.ctrl();
        self.tail(self.me).store(pos, SeqCst);
        if c.space_waiters.load(SeqCst) != 0 {
            // Wake the root only when its wait is over (the root's own tail is at its head,
            // past the mark).
            let mark = c.space_need.load(SeqCst).saturating_sub(self.cap);
            if (0..self.members).all(|r| self.tail(r).load(SeqCst) >= mark) {
                c.space_seq.fetch_add(1, SeqCst);
                futex::wake_all(&c.space_seq);
            }
        }
    }

    /// Root: waits until every other member's tail is at least `need - cap`.
    fn wait_space(
        &self,
        need: u64,
        idle: Duration,
        alive: &dyn Fn(usize) -> bool,
    ) -> Result<(), End> {
        let lagging = || {
            (0..self.members)
                .filter(|&r| r != self.me)
                .find(|&r| self.tail(r).load(SeqCst) + self.cap < need)
        };
        let progress = || {
            (0..self.members)
                .map(|r| self.tail(r).load(SeqCst))
                .fold(0u64, u64::wrapping_add)
        };
        let c = self.ctrl();
        c.space_need.store(need, SeqCst);
        let stalled = || {
            c.stalled
                .store(lagging().map_or(0, |r| r as u64 + 1), SeqCst)
        };
        stalled();
        let r = self.wait(
            &|| lagging().is_none(),
            &progress,
            (&c.space_seq, &c.space_waiters),
            idle,
            &|| match (0..self.members)
                .filter(|&r| r != self.me && self.tail(r).load(SeqCst) + self.cap < need)
                .find(|&r| !alive(r))
            {
                Some(r) => Err(End::Dead(r)),
                None => {
                    stalled();
                    Ok(())
                }
            },
            &|| lagging().unwrap_or(self.me),
        );
        c.stalled.store(0, SeqCst);
        r
    }

    /// Receiver: waits until `head >= need`.
    fn wait_data(
        &self,
        need: u64,
        root: usize,
        idle: Duration,
        alive: &dyn Fn(usize) -> bool,
    ) -> Result<(), End> {
        let c = self.ctrl();
        self.wait(
            &|| c.head.load(SeqCst) >= need,
            &|| c.head.load(SeqCst),
            (&c.data_seq, &c.data_waiters),
            idle,
            &|| {
                if alive(root) {
                    Ok(())
                } else {
                    Err(End::Dead(root))
                }
            },
            // A root that itself waits for a slow member passes the blame on.
            &|| match c.stalled.load(SeqCst) {
                0 => root,
                s => (s - 1) as usize,
            },
        )
    }

    /// Spins, then sleeps in slices until `ready`; `idle` without a change of `progress` ends
    /// in `Timeout(blame())`; `check` runs after each slice (liveness).
    fn wait(
        &self,
        ready: &dyn Fn() -> bool,
        progress: &dyn Fn() -> u64,
        (seq, waiters): (&AtomicU32, &AtomicU32),
        idle: Duration,
        check: &dyn Fn() -> Result<(), End>,
        blame: &dyn Fn() -> usize,
    ) -> Result<(), End> {
        futex::spin(self.spin, ready);
        let mut seen = progress();
        let mut deadline = Instant::now() + idle;
        loop {
            waiters.fetch_add(1, SeqCst);
            let s = seq.load(SeqCst);
            let now = Instant::now();
            let verdict = if ready() {
                Some(Ok(()))
            } else if let Err(e) = self.check_abort() {
                Some(Err(e))
            } else if now >= deadline {
                Some(Err(End::Timeout(blame())))
            } else {
                futex::wait(seq, s, (deadline - now).min(SLICE));
                None
            };
            waiters.fetch_sub(1, SeqCst);
            if let Some(v) = verdict {
                return v;
            }
            if ready() {
                return Ok(());
            }
            if let Err(e) = check() {
                // A member that gave up stored the abort word before it could exit: its
                // reason (naming the culprit) wins over its own departure.
                self.check_abort()?;
                return Err(e);
            }
            let p = progress();
            if p != seen {
                seen = p;
                deadline = Instant::now() + idle;
            }
        }
    }
}
