//! Broadcast through a group's shared segment (`link/shm/bcast.rs`) when every pair of its
//! members is shm: the root copies the message in once, every receiver copies it out in its
//! own process at the same time. Groups with a pair on another backend (or group rank 0
//! configured with `broadcast_bytes = 0`) take the pipelined chain in `collective.rs`.
//!
//! Set-up, at the group's first broadcast (a collective call, so every member is in it):
//! group rank 0 creates the segment and hands its memfd to every other member over their shm
//! link's Unix socket (tag = the group id); a `value` of 0 without an fd means "chain". Each
//! process keeps one state per group (keyed by its world ranks): chain, a mapped segment with
//! this member's cursor, or broken after a failure mid-broadcast (later calls fail with
//! `Broken`, as a poisoned link does).

use super::Communicator;
use crate::error::{Result, TransportError};
use crate::link::Link;
use crate::link::shm::{Cursor, End, Reason, Segment, ShmLink, ShmStats};
use crate::plan::BackendKind;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Broadcast state of every group of this process that has broadcast.
#[derive(Default)]
pub(crate) struct Segments {
    groups: Mutex<HashMap<Arc<[usize]>, Entry>>,
}

/// One group's state, locked for the whole of each of its broadcasts.
type Entry = Arc<Mutex<State>>;

enum State {
    Unset,
    Chain,
    Ready {
        seg: Segment,
        cur: Cursor,
        stats: ShmStats,
    },
    Broken {
        rank: usize,
        addr: String,
        cause: String,
    },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Segments {
    fn entry(&self, ranks: &Arc<[usize]>) -> Entry {
        let mut g = lock(&self.groups);
        Arc::clone(
            g.entry(Arc::clone(ranks))
                .or_insert_with(|| Arc::new(Mutex::new(State::Unset))),
        )
    }

    /// Counters of the group's shared broadcasts (zero when it has none).
    pub(crate) fn stats(&self, ranks: &[usize]) -> ShmStats {
        let entry = lock(&self.groups).get(ranks).cloned();
        match entry.as_deref().map(lock).as_deref() {
            Some(State::Ready { stats, .. }) => *stats,
            _ => ShmStats::default(),
        }
    }
}

impl Communicator {
    /// Broadcasts through the group's shared segment. `Ok(false)`: the group uses the chain.
    pub(super) fn broadcast_shared(&self, root: usize, buf: &mut [u8]) -> Result<bool> {
        if !self.all_pairs_shm() {
            return Ok(false);
        }
        let entry = self.world.segments.entry(&self.ranks);
        let mut st = lock(&entry);
        if matches!(*st, State::Unset) {
            match self.setup_segment() {
                Ok(s) => *st = s,
                Err(e) => {
                    let rank = match &e {
                        TransportError::Timeout { rank, .. }
                        | TransportError::PeerDied { rank, .. }
                        | TransportError::Broken { rank, .. } => *rank,
                        _ => self.global_rank(),
                    };
                    *st = State::Broken {
                        rank,
                        addr: "broadcast segment set-up".into(),
                        cause: e.to_string(),
                    };
                    return Err(e);
                }
            }
        }
        let (seg, cur, stats) = match &mut *st {
            State::Unset | State::Chain => return Ok(false),
            State::Broken { rank, addr, cause } => {
                return Err(TransportError::Broken {
                    rank: *rank,
                    addr: addr.clone(),
                    cause: cause.clone(),
                });
            }
            State::Ready { seg, cur, stats } => (seg, cur, stats),
        };
        let idle = self.world.timeout;
        let alive = |r: usize| self.shm_link(r).is_none_or(ShmLink::alive);
        let root_id = self.ranks[root] as u64;
        let r = if root == self.me {
            seg.publish(cur, root_id, buf, idle, &alive)
                .map(|()| buf.len() as u64)
        } else {
            seg.receive(cur, root, root_id, buf, idle, &alive)
        };
        match r {
            Ok(sent) if sent == buf.len() as u64 => {
                stats.shared_broadcasts += 1;
                stats.shared_broadcast_bytes += sent;
                Ok(true)
            }
            Ok(sent) => Err(TransportError::SizeMismatch {
                src: self.ranks[root],
                dst: self.global_rank(),
                tag: 0,
                sent,
                expected: buf.len() as u64,
            }),
            Err(end) => {
                let (e, culprit) = self.segment_error(seg, end);
                *st = State::Broken {
                    rank: self.ranks[culprit],
                    addr: self.addr_of(culprit),
                    cause: e.to_string(),
                };
                Err(e)
            }
        }
    }

    /// True when every pair of members is planned on shm (the same answer on every member).
    fn all_pairs_shm(&self) -> bool {
        let plan = &self.world.plan;
        self.ranks.len() >= 2
            && self.ranks.iter().enumerate().all(|(i, &a)| {
                self.ranks[i + 1..]
                    .iter()
                    .all(|&b| plan.backend(a, b) == BackendKind::Shm)
            })
    }

    fn shm_link(&self, r: usize) -> Option<&ShmLink> {
        self.peer(r).ok().and_then(|p| p.link().as_shm())
    }

    fn shm_link_or_err(&self, r: usize) -> Result<&ShmLink> {
        self.shm_link(r).ok_or_else(|| {
            TransportError::Invalid(format!(
                "group rank {r} was planned on shm but has no shm link"
            ))
        })
    }

    fn addr_of(&self, r: usize) -> String {
        match self.peer(r) {
            Ok(p) => p.link().peer().addr.clone(),
            Err(_) => "this rank".into(),
        }
    }

    /// Group rank 0 creates the segment and passes it on; the others map it.
    fn setup_segment(&self) -> Result<State> {
        let (n, me, idle, opts) = (
            self.world_size(),
            self.me,
            self.world.timeout,
            self.world.shm,
        );
        let tag = self.id;
        let seg = if me == 0 {
            if opts.broadcast_bytes == 0 {
                for r in 1..n {
                    self.shm_link_or_err(r)?.send_fd(tag, 0, None, idle)?;
                }
                return Ok(State::Chain);
            }
            let seg = Segment::create(n, u64::from(tag), &opts)
                .map_err(|e| TransportError::io("creating the shm broadcast segment", e))?;
            for r in 1..n {
                let sent = self
                    .shm_link_or_err(r)
                    .and_then(|l| l.send_fd(tag, seg.cap(), Some(seg.fd()), idle));
                if let Err(e) = sent {
                    // Members that already mapped the segment stop at once, naming `r`.
                    let reason = match e {
                        TransportError::PeerDied { .. } => Reason::Died,
                        _ => Reason::Protocol,
                    };
                    seg.abort(r, reason);
                    return Err(e);
                }
            }
            seg
        } else {
            let link = self.shm_link_or_err(0)?;
            match link.recv_fd(tag, idle)? {
                (0, None) => return Ok(State::Chain),
                (_, Some(fd)) => {
                    Segment::open(fd, n, me, u64::from(tag), &opts).map_err(|msg| {
                        TransportError::Protocol {
                            peer: link.peer().to_string(),
                            msg,
                        }
                    })?
                }
                (v, None) => {
                    return Err(TransportError::Protocol {
                        peer: link.peer().to_string(),
                        msg: format!("broadcast segment of {v} bytes arrived without its memfd"),
                    });
                }
            }
        };
        Ok(State::Ready {
            seg,
            cur: Cursor::default(),
            stats: ShmStats::default(),
        })
    }

    /// The error for a failed segment operation, and the group rank it blames. Failures this
    /// member found are stored in the abort word first, so the others stop waiting.
    fn segment_error(&self, seg: &Segment, end: End) -> (TransportError, usize) {
        let world = |r: usize| self.ranks.get(r).copied().unwrap_or(usize::MAX);
        match end {
            End::Timeout(r) => {
                seg.abort(r, Reason::TimedOut);
                let e = TransportError::Timeout {
                    rank: world(r),
                    addr: self.addr_of(r),
                    what: "broadcast (shared segment)".into(),
                    timeout: self.world.timeout,
                };
                (e, r)
            }
            End::Dead(r) => {
                seg.abort(r, Reason::Died);
                let e = TransportError::PeerDied {
                    rank: world(r),
                    addr: self.addr_of(r),
                    what: "broadcast (shared segment)".into(),
                };
                (e, r)
            }
            End::Protocol(msg) => {
                seg.abort(self.me, Reason::Protocol);
                let e = TransportError::Protocol {
                    peer: format!("the broadcast segment of group {:?}", self.ranks),
                    msg,
                };
                (e, self.me)
            }
            End::Aborted {
                culprit,
                reporter,
                reason,
            } => {
                let by = world(reporter);
                let e = match reason {
                    Reason::Died => TransportError::PeerDied {
                        rank: world(culprit),
                        addr: self.addr_of(culprit),
                        what: format!("broadcast (shared segment; reported by rank {by})"),
                    },
                    Reason::TimedOut | Reason::Protocol => TransportError::Broken {
                        rank: world(culprit),
                        addr: self.addr_of(culprit),
                        cause: format!(
                            "rank {by} abandoned the shared-segment broadcast ({})",
                            if reason == Reason::TimedOut {
                                "timed out"
                            } else {
                                "protocol error"
                            }
                        ),
                    },
                };
                (e, culprit.min(self.ranks.len().saturating_sub(1)))
            }
        }
    }
}
