//! `Communicator`: a group of ranks with point-to-point and collective operations on host
//! byte buffers. The world is the group of all ranks; sub-groups are made from rank lists and
//! share the world's links. Ranks passed to a communicator's methods are group-local.
//!
//! ```no_run
//! use tandem_transport::{CommConfig, Communicator};
//! use tandem_transport::topology::Colocated;
//! let cfg = CommConfig::from_env()?; // set by the launcher
//! let topo = Colocated::new(cfg.world_size / 2);
//! let world = Communicator::init(&cfg)?;
//! let groups = world.groups(&topo.groups_of(world.rank()))?; // "trainers", "pair3", ...
//! if let Some(t) = groups.get("trainers") {
//!     let mut step = [0u8; 8];
//!     t.broadcast(0, &mut step)?;
//! }
//! # Ok::<(), tandem_transport::TransportError>(())
//! ```

mod bcast;
mod collective;
pub(crate) mod config;
mod handle;
pub(crate) mod init;
mod peer;

pub use handle::Pending;

use crate::error::{Result, TransportError};
use crate::link::MsgKey;
use crate::plan::{BackendKind, Plan};
use crate::store::StoreClient;
use crate::topology::{GroupSpec, Placement};
use config::CommConfig;
use peer::Peer;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Message kinds (part of the frame key), so user tags never collide with collectives.
pub(crate) mod kind {
    pub const P2P: u32 = 0;
    pub const BROADCAST: u32 = 1;
    pub const ALL_GATHER: u32 = 2;
    pub const BARRIER: u32 = 3;
}

struct World {
    rank: usize,
    peers: Vec<Option<Peer>>,
    plan: Plan,
    placements: Vec<Placement>,
    store: StoreClient,
    timeout: Duration,
    name: String,
    shm: crate::link::shm::ShmOptions,
    segments: bcast::Segments,
}

/// A communicator over a group of ranks. Cheap to clone; clones share links.
#[derive(Clone)]
pub struct Communicator {
    world: Arc<World>,
    ranks: Arc<[usize]>,
    me: usize,
    id: u32,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("world", &self.world.name)
            .field("ranks", &self.ranks)
            .field("rank", &self.me)
            .finish()
    }
}

/// FNV-1a over the group's world ranks: equal on every member without communication.
fn group_id(ranks: &[usize]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for r in ranks {
        for b in (*r as u64).to_le_bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// FNV-1a of a name (short, stable identifiers for socket names).
pub(crate) fn group_id_of_name(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Communicator {
    /// Joins the world described by `cfg`: rendezvous through the store, plan, open links.
    /// Blocks until every peer has connected, or fails after `cfg.timeout` naming the missing
    /// rank.
    pub fn init(cfg: &CommConfig) -> Result<Communicator> {
        let j = init::join(cfg)?;
        let ranks: Arc<[usize]> = (0..cfg.world_size).collect();
        Ok(Communicator {
            id: group_id(&ranks),
            ranks,
            me: cfg.rank,
            world: Arc::new(World {
                rank: cfg.rank,
                peers: j.peers,
                plan: j.plan,
                placements: j.placements,
                store: j.store,
                timeout: cfg.timeout,
                name: cfg.name.clone(),
                shm: cfg.shm,
                segments: Default::default(),
            }),
        })
    }

    /// This rank within the group.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.ranks.len()
    }

    /// This process's rank in the world.
    pub fn global_rank(&self) -> usize {
        self.world.rank
    }

    /// World ranks of the group's members, in group order.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// The world's plan (backend per pair).
    pub fn plan(&self) -> &Plan {
        &self.world.plan
    }

    /// Placements of all world ranks, as published at rendezvous.
    pub fn placements(&self) -> &[Placement] {
        &self.world.placements
    }

    /// The backend to group rank `peer`.
    pub fn backend_to(&self, peer: usize) -> Result<BackendKind> {
        Ok(self.peer(peer)?.link().kind())
    }

    /// Counters of the shm links to this group's members (summed): which messages went by
    /// single copy and how many payload bytes crossed the rings; plus this group's broadcasts
    /// through its shared segment.
    pub fn shm_stats(&self) -> crate::link::shm::ShmStats {
        let mut total = self.world.segments.stats(&self.ranks);
        for &w in self.ranks.iter() {
            if let Some(s) = self.world.peers[w]
                .as_ref()
                .and_then(|p| p.link().shm_stats())
            {
                total += s;
            }
        }
        total
    }

    /// The rendezvous store connection (for callers that exchange their own keys).
    pub fn store(&self) -> &StoreClient {
        &self.world.store
    }

    /// The operation timeout (longest wait without progress).
    pub fn timeout(&self) -> Duration {
        self.world.timeout
    }

    /// A sub-group from group-local `ranks` (order = new group order). Purely local: every
    /// member computes the same group from the same list. Fails if this rank is not a member
    /// or a rank repeats or is out of range.
    pub fn subgroup(&self, ranks: &[usize]) -> Result<Communicator> {
        let mut world_ranks = Vec::with_capacity(ranks.len());
        for &r in ranks {
            let w = self.world_rank(r)?;
            if world_ranks.contains(&w) {
                return Err(TransportError::Invalid(format!(
                    "rank {r} appears twice in group {ranks:?}"
                )));
            }
            world_ranks.push(w);
        }
        let me = world_ranks
            .iter()
            .position(|&w| w == self.world.rank)
            .ok_or_else(|| {
                TransportError::Invalid(format!(
                    "rank {} is not a member of group {ranks:?}; create groups only on members",
                    self.me
                ))
            })?;
        Ok(Communicator {
            world: Arc::clone(&self.world),
            id: group_id(&world_ranks),
            ranks: world_ranks.into(),
            me,
        })
    }

    /// Builds the named groups (world ranks) this rank belongs to; others are skipped. Call on
    /// the world communicator.
    pub fn groups(&self, specs: &[GroupSpec]) -> Result<BTreeMap<String, Communicator>> {
        let mut out = BTreeMap::new();
        for s in specs {
            if s.ranks.contains(&self.world.rank) {
                let local: Result<Vec<usize>> = s.ranks.iter().map(|&w| self.local_of(w)).collect();
                out.insert(s.name.clone(), self.subgroup(&local?)?);
            }
        }
        Ok(out)
    }

    /// Sends `data` to group rank `dst` with `tag`. Returns when the data is handed to the
    /// transport (the ring or socket), not necessarily received; shm messages of at least
    /// [`ShmOptions::single_copy_min_bytes`](crate::ShmOptions) return once the receiver has
    /// copied them out of `data` (single-copy rendezvous).
    pub fn send(&self, dst: usize, data: &[u8], tag: u32) -> Result<()> {
        self.send_kind(dst, data, kind::P2P, tag)
    }

    /// Receives a message with `tag` from group rank `src` into `buf`, whose length must
    /// equal the sent length (else `SizeMismatch` naming both).
    pub fn recv(&self, src: usize, buf: &mut [u8], tag: u32) -> Result<()> {
        self.recv_kind(src, buf, kind::P2P, tag)
    }

    /// Non-blocking send: runs on a background thread; `wait()` returns the buffer.
    pub fn isend(&self, dst: usize, data: Vec<u8>, tag: u32) -> Pending<Vec<u8>> {
        let c = self.clone();
        Pending::spawn("isend", move || c.send(dst, &data, tag).map(|()| data))
    }

    /// Non-blocking receive into `buf`: `wait()` returns the filled buffer.
    pub fn irecv(&self, src: usize, mut buf: Vec<u8>, tag: u32) -> Pending<Vec<u8>> {
        let c = self.clone();
        Pending::spawn("irecv", move || c.recv(src, &mut buf, tag).map(|()| buf))
    }

    /// Non-blocking broadcast: `wait()` returns the buffer (filled on non-roots).
    pub fn ibroadcast(&self, root: usize, mut buf: Vec<u8>) -> Pending<Vec<u8>> {
        let c = self.clone();
        Pending::spawn("ibroadcast", move || {
            c.broadcast(root, &mut buf).map(|()| buf)
        })
    }

    pub(crate) fn world_rank(&self, r: usize) -> Result<usize> {
        self.ranks.get(r).copied().ok_or_else(|| {
            TransportError::Invalid(format!(
                "rank {r} is out of range for a group of {} ranks",
                self.ranks.len()
            ))
        })
    }

    fn local_of(&self, world: usize) -> Result<usize> {
        self.ranks.iter().position(|&w| w == world).ok_or_else(|| {
            TransportError::Invalid(format!("world rank {world} is not in this group"))
        })
    }

    fn peer(&self, r: usize) -> Result<&Peer> {
        let w = self.world_rank(r)?;
        self.world.peers[w].as_ref().ok_or_else(|| {
            TransportError::Invalid(format!(
                "rank {r} is this rank; send/recv to self is not supported"
            ))
        })
    }

    pub(crate) fn send_kind(&self, dst: usize, data: &[u8], k: u32, tag: u32) -> Result<()> {
        let key = MsgKey {
            group: self.id,
            kind: k,
            tag,
        };
        self.peer(dst)?.send(key, data, self.world.timeout)
    }

    pub(crate) fn recv_kind(&self, src: usize, buf: &mut [u8], k: u32, tag: u32) -> Result<()> {
        let key = MsgKey {
            group: self.id,
            kind: k,
            tag,
        };
        self.peer(src)?.recv(key, buf, self.world.timeout)
    }
}
