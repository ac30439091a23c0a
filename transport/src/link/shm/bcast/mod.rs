//! Shared broadcast segment of a group whose members all share one host: one memfd that every
//! member maps, holding a single-producer multi-consumer byte ring. The root of a broadcast
//! copies each piece in once; every receiver copies it out into its own buffer, in its own
//! process (so on its own core), at the same time as the others.
//!
//! Layout: bytes `0..512` = [`Ctrl`]; then one 64-byte line per member holding its `tail`
//! (bytes of the ring it is done with); the data ring starts at the next page.
//!
//! Protocol (positions are byte counts since the segment was created, all multiples of 64):
//! - each broadcast is a frame: a 64-byte header `{magic, root, seq, len}`, then `len` bytes
//!   padded to 64; the root claims broadcast `seq` with a compare-exchange on `claim`
//!   (`seq - 1 -> seq`), so two members that both think they are root are told so.
//! - the root writes at most `chunk` bytes at a time, then publishes `head` (and its own
//!   tail); it may overwrite ring bytes only once every other member's tail has passed them.
//! - a receiver waits for `head`, checks the header (a size mismatch still consumes the
//!   frame, so the next broadcast is read normally), copies out what is published and
//!   publishes its tail after each piece.
//! - waits spin briefly, then sleep on a futex word (`data_seq` for receivers, `space_seq` for
//!   the root) after counting themselves in a waiter count; the other side wakes only when
//!   the count is non-zero (SeqCst on both sides = no lost wake-up). A root out of space
//!   waits for a whole chunk (`space_need`), and a receiver wakes it only when its release
//!   leaves every tail past that mark (of receivers finishing together, at least one sees
//!   all the stores), so the root is not woken by each receiver's every piece. Every wait runs in 50 ms
//!   slices, checks the abort word and the liveness of the member it waits for, and ends
//!   with [`End::Timeout`] after `idle` without progress, naming the member it waited for (a
//!   receiver names the member the root itself waits for, from `stalled`, if any).
//! - a member that fails mid-broadcast stores the abort word (first reason wins) and wakes
//!   everyone: the others stop with [`End::Aborted`] instead of waiting out their timeout.

use super::ShmOptions;
use super::copy::copy_out;
use super::futex;
use memmap2::MmapRaw;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

mod flow;

const MAGIC: u64 = 0x544e_4442_4341_0001; // "TNDBCA" v1
const FRAME_MAGIC: u64 = 0x4243_4652_414d_4531; // "BCFRAME1"
const LINE: u64 = 64;
const CTRL_BYTES: usize = 512;
const PAGE: usize = 4096;
const SLICE: Duration = Duration::from_millis(50);

/// Shared control block; hot fields on separate cache lines.
#[repr(C)]
struct Ctrl {
    magic: AtomicU64,
    cap: AtomicU64,
    members: AtomicU64,
    tag: AtomicU64,
    _p0: [u8; 32],
    head: AtomicU64,
    _p1: [u8; 56],
    data_seq: AtomicU32,
    data_waiters: AtomicU32,
    _p2: [u8; 56],
    space_seq: AtomicU32,
    space_waiters: AtomicU32,
    _p3: [u8; 56],
    claim: AtomicU64,
    /// While the root waits for ring space: 1 + the group rank it waits for, else 0.
    stalled: AtomicU64,
    /// The end position the root's last wait for space needed (every tail >= it - cap).
    space_need: AtomicU64,
    _p4: [u8; 40],
    /// 0, or `1 << 63 | reason << 48 | reporter << 24 | culprit` (group-local ranks).
    abort: AtomicU64,
    _p5: [u8; 56],
}

const _: () = assert!(std::mem::size_of::<Ctrl>() <= CTRL_BYTES);

/// Why a member abandoned a broadcast (stored in the abort word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The culprit process died.
    Died = 1,
    /// The culprit made no progress within the idle timeout.
    TimedOut = 2,
    /// Members disagreed (root, sequence) or the segment held garbage.
    Protocol = 3,
}

/// Why a segment operation ended without completing.
#[derive(Debug)]
pub(crate) enum End {
    /// No progress from this group-local rank within the idle timeout.
    Timeout(usize),
    /// This group-local rank's process is gone.
    Dead(usize),
    /// Another member abandoned the broadcast.
    Aborted {
        culprit: usize,
        reporter: usize,
        reason: Reason,
    },
    /// The segment or the members' calls are inconsistent.
    Protocol(String),
}

/// Where this member stands in the segment: next frame position and broadcasts done.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Cursor {
    pos: u64,
    seq: u64,
}

/// One member's view of a group's broadcast segment.
pub(crate) struct Segment {
    map: MmapRaw,
    file: File,
    cap: u64,
    /// Largest piece the root publishes at once (a receiver copies up to twice that).
    chunk: u64,
    members: usize,
    me: usize,
    spin: Duration,
}

// SAFETY: the raw mapping is owned by the segment; shared fields are atomics and ring bytes
// are only touched in ranges the protocol hands to this member (the caller serialises
// broadcasts of one group within the process).
unsafe impl Send for Segment {}
// SAFETY: see `Send`.
unsafe impl Sync for Segment {}

fn data_offset(members: usize) -> usize {
    (CTRL_BYTES + members * LINE as usize).div_ceil(PAGE) * PAGE
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(LINE) * LINE
}

/// The root's publish piece: `opts.chunk_bytes`, or for 0 the links' rule (ring/16, at most
/// 256 KiB), kept between 4 KiB and half the ring, in whole lines.
fn chunk(cap: u64, opts: &ShmOptions) -> u64 {
    let c = match opts.chunk_bytes {
        0 => (cap / 16).clamp(4096, 256 << 10),
        c => (c as u64).clamp(4096, cap / 2),
    };
    round_up(c)
}

impl Segment {
    /// Creates the segment (group rank 0): `opts.broadcast_bytes` ring bytes (rounded up to a
    /// power of two, at least 64 KiB), `members` tails, `tag` identifying the group.
    pub(crate) fn create(members: usize, tag: u64, opts: &ShmOptions) -> std::io::Result<Segment> {
        let cap = opts.broadcast_bytes.max(64 << 10).next_power_of_two();
        let fd = nix::sys::memfd::memfd_create(
            c"tandem-shm-broadcast",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )?;
        let file = File::from(fd);
        file.set_len((data_offset(members) + cap) as u64)?;
        let map = MmapRaw::map_raw(&file)?;
        let seg = Segment {
            map,
            file,
            cap: cap as u64,
            chunk: chunk(cap as u64, opts),
            members,
            me: 0,
            spin: opts.spin,
        };
        let c = seg.ctrl();
        c.cap.store(cap as u64, SeqCst);
        c.members.store(members as u64, SeqCst);
        c.tag.store(tag, SeqCst);
        c.magic.store(MAGIC, SeqCst);
        Ok(seg)
    }

    /// Maps a segment received from group rank 0 as member `me`; checks that it was made
    /// for this group.
    pub(crate) fn open(
        fd: OwnedFd,
        members: usize,
        me: usize,
        tag: u64,
        opts: &ShmOptions,
    ) -> Result<Segment, String> {
        let file = File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| format!("stat of the broadcast segment: {e}"))?
            .len() as usize;
        if len < data_offset(members) + (64 << 10) {
            return Err(format!("broadcast segment of {len} bytes is too small"));
        }
        let map =
            MmapRaw::map_raw(&file).map_err(|e| format!("mapping the broadcast segment: {e}"))?;
        let cap = (len - data_offset(members)) as u64;
        let seg = Segment {
            map,
            file,
            cap,
            chunk: chunk(cap, opts),
            members,
            me,
            spin: opts.spin,
        };
        let c = seg.ctrl();
        let (magic, c_cap, c_members, c_tag) = (
            c.magic.load(SeqCst),
            c.cap.load(SeqCst),
            c.members.load(SeqCst),
            c.tag.load(SeqCst),
        );
        if magic != MAGIC || c_cap != cap || !cap.is_power_of_two() {
            return Err(format!(
                "broadcast segment header mismatch (magic {magic:#x}, ring {c_cap} of {cap})"
            ));
        }
        if c_members != members as u64 || c_tag != tag {
            return Err(format!(
                "broadcast segment was made for {c_members} members (tag {c_tag:#x}), not \
                 this group of {members} (tag {tag:#x})"
            ));
        }
        Ok(seg)
    }

    /// The memfd, to pass to the other members.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Ring bytes.
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    fn ctrl(&self) -> &Ctrl {
        // SAFETY: the mapping is at least CTRL_BYTES long, page-aligned, and lives as long as
        // `self`; `Ctrl` is all atomics (any bit pattern is valid, a fresh memfd is zeroed).
        unsafe { &*(self.map.as_ptr() as *const Ctrl) }
    }

    fn tail(&self, r: usize) -> &AtomicU64 {
        debug_assert!(r < self.members);
        // SAFETY: line r of the tails area lies inside the mapping (data_offset covers
        // CTRL_BYTES + members lines) and is 64-byte aligned; atomics accept any bit pattern.
        unsafe { &*(self.map.as_ptr().add(CTRL_BYTES + r * LINE as usize) as *const AtomicU64) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: data_offset(members) + cap is the mapping's length (checked in `open`).
        unsafe { self.map.as_mut_ptr().add(data_offset(self.members)) }
    }

    /// Copies `src` into the ring at position `pos` (wrapping).
    ///
    /// # Safety
    /// `[pos, pos + src.len())` must be ring bytes every other member is done with and
    /// `src.len() <= cap`.
    unsafe fn put(&self, pos: u64, src: &[u8]) {
        let at = (pos & (self.cap - 1)) as usize;
        let first = src.len().min(self.cap as usize - at);
        // SAFETY: both pieces are inside the data area (at < cap, the rest wraps to 0) and
        // not read by anyone (caller contract); `src` does not overlap the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data().add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data(), src.len() - first);
        }
    }

    /// Copies `dst.len()` ring bytes at `pos` into `dst` (wrapping).
    ///
    /// # Safety
    /// `[pos, pos + dst.len())` must be published and not yet released by this member.
    unsafe fn get(&self, pos: u64, dst: &mut [u8], stream: bool) {
        let at = (pos & (self.cap - 1)) as usize;
        let first = dst.len().min(self.cap as usize - at);
        // SAFETY: as in `put`; the root does not write these bytes until our tail passes them.
        unsafe {
            copy_out(self.data().add(at), dst.as_mut_ptr(), first, stream);
            copy_out(
                self.data(),
                dst.as_mut_ptr().add(first),
                dst.len() - first,
                stream,
            );
        }
    }

    /// Stores the abort word (unless another member did first) and wakes every waiter.
    pub(crate) fn abort(&self, culprit: usize, reason: Reason) {
        let w = 1 << 63 | (reason as u64) << 48 | (self.me as u64) << 24 | culprit as u64;
        let c = self.ctrl();
        let _ = c.abort.compare_exchange(0, w, SeqCst, SeqCst);
        for seq in [&c.data_seq, &c.space_seq] {
            seq.fetch_add(1, SeqCst);
            futex::wake_all(seq);
        }
    }

    fn check_abort(&self) -> Result<(), End> {
        let w = self.ctrl().abort.load(SeqCst);
        if w == 0 {
            return Ok(());
        }
        let reason = match (w >> 48) & 0xff {
            1 => Reason::Died,
            2 => Reason::TimedOut,
            _ => Reason::Protocol,
        };
        Err(End::Aborted {
            culprit: (w & 0xff_ffff) as usize,
            reporter: ((w >> 24) & 0xff_ffff) as usize,
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    //! In-process checks of the segment protocol with one thread per member (frames of every
    //! size wrapping a small ring from every root, abort, liveness); the multi-process
    //! behaviour is covered by `tests/it/broadcast.rs`.
    #![allow(clippy::unwrap_used)]

    use super::*;

    const IDLE: Duration = Duration::from_secs(20);

    fn group(n: usize, cap: usize) -> Vec<Segment> {
        let o = ShmOptions {
            broadcast_bytes: cap,
            chunk_bytes: 4096,
            spin: Duration::from_micros(5),
            ..Default::default()
        };
        let first = Segment::create(n, 7, &o).unwrap();
        let mut v: Vec<Segment> = (1..n)
            .map(|r| Segment::open(first.fd().try_clone_to_owned().unwrap(), n, r, 7, &o).unwrap())
            .collect();
        v.insert(0, first);
        v
    }

    fn bytes(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|j| (j * 31 + i * 7) as u8).collect()
    }

    #[test]
    fn frames_of_every_size_wrap_a_small_ring_from_every_root() {
        let sizes: Vec<usize> = (0..60).map(|i| (i * 7919 * 13) % 200_000).collect();
        std::thread::scope(|s| {
            for (me, seg) in group(3, 64 << 10).into_iter().enumerate() {
                let sizes = &sizes;
                s.spawn(move || {
                    let mut cur = Cursor::default();
                    let alive = |_| true;
                    for (i, &len) in sizes.iter().enumerate() {
                        let root = i % 3;
                        if me == root {
                            seg.publish(&mut cur, root as u64, &bytes(i, len), IDLE, &alive)
                                .unwrap();
                        } else {
                            let mut got = vec![0u8; len];
                            let sent = seg
                                .receive(&mut cur, root, root as u64, &mut got, IDLE, &alive)
                                .unwrap();
                            assert_eq!(sent, len as u64);
                            assert!(got == bytes(i, len), "frame {i} of {len} bytes");
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn mismatch_consumes_the_frame_and_abort_stops_waiters() {
        let segs = group(3, 64 << 10);
        let alive = |_| true;
        let mut curs = [Cursor::default(); 3];
        segs[0]
            .publish(&mut curs[0], 0, &bytes(1, 1000), IDLE, &alive)
            .unwrap();
        let mut small = vec![0u8; 10];
        let sent = segs[1].receive(&mut curs[1], 0, 0, &mut small, IDLE, &alive);
        assert_eq!(sent.unwrap(), 1000);
        assert_eq!(small, vec![0u8; 10], "a mismatched receive copies nothing");
        let mut ok = vec![0u8; 1000];
        segs[2]
            .receive(&mut curs[2], 0, 0, &mut ok, IDLE, &alive)
            .unwrap();
        assert_eq!(ok, bytes(1, 1000));
        // Member 1 waits for broadcast 2; member 2 reports member 0 dead.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut b = vec![0u8; 5];
                segs[1].receive(&mut curs[1], 0, 0, &mut b, IDLE, &alive)
            });
            std::thread::sleep(Duration::from_millis(20));
            segs[2].abort(0, Reason::Died);
            match waiter.join().unwrap() {
                Err(End::Aborted {
                    culprit: 0,
                    reporter: 2,
                    reason: Reason::Died,
                }) => {}
                other => panic!("expected Aborted, got {other:?}"),
            }
        });
    }

    #[test]
    fn a_dead_root_or_a_dead_lagging_member_is_named() {
        let segs = group(2, 64 << 10);
        let dead = |_| false;
        let mut b = [0u8; 8];
        match segs[1].receive(&mut Cursor::default(), 0, 0, &mut b, IDLE, &dead) {
            Err(End::Dead(0)) => {}
            other => panic!("expected Dead(0), got {other:?}"),
        }
        // The root fills the ring, then waits for member 1, which is gone.
        let big = vec![1u8; 200 << 10];
        match segs[0].publish(&mut Cursor::default(), 0, &big, IDLE, &dead) {
            Err(End::Dead(1)) => {}
            other => panic!("expected Dead(1), got {other:?}"),
        }
    }
}
