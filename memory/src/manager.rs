//! [`MemoryManager`]: one per device per process. Allocates tagged regions under a byte budget,
//! pauses and resumes them by tag, honours [`ResidentGuard`]s, and reports to the ledger.
//! Snapshots live in `snapshot.rs` and use the same state.
//!
//! Policy (documented contract):
//! - `pause(tags)` and `resume(tags)` are all-or-nothing checks: if any selected region is in the
//!   wrong state, guarded, or borrowed by a view, nothing changes and the error names it. A tag
//!   with no regions selects nothing and is not an error. If the kernel fails mid-way the regions
//!   done so far stay done (each region's state stays accurate).
//! - A held `keep_resident` guard makes `pause` of its tags fail at once with `KeptResident`;
//!   `pause_wait` waits (up to a timeout) for the guards to drop. Guards do not resume anything.
//! - The budget caps *resident* bytes: `alloc` and `resume` fail with `OverBudget` past the cap.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::budget::Budget;
use crate::error::{MemoryError, Result};
use crate::ledger::ProcessReport;
use crate::region::{Region, RegionCell};
use crate::snapshot::Snapshot;
use crate::tag::{RegionSpec, Tag};

/// How a manager is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerConfig {
    /// Name of this process in ledger reports (e.g. `engine-0`).
    pub process: String,
    /// Device label in reports (`cpu`, `cuda:0`).
    pub device: String,
    /// Byte cap on resident memory.
    pub budget: Budget,
    /// Threads a pause or resume of a large region may use (1 = the calling thread only).
    /// Default: 2 when the machine has at least 2 CPUs.
    pub move_threads: usize,
}

impl ManagerConfig {
    /// A CPU manager with no cap.
    pub fn cpu(process: impl Into<String>) -> Self {
        ManagerConfig {
            process: process.into(),
            device: "cpu".into(),
            budget: Budget::unlimited(),
            move_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(2)),
        }
    }

    /// The same config with another thread count for moving memory (at least 1).
    pub fn with_move_threads(mut self, threads: usize) -> Self {
        self.move_threads = threads.max(1);
        self
    }
    /// The same config with a budget.
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }
}

/// What a pause or resume did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Regions affected.
    pub regions: usize,
    /// Their total size in bytes.
    pub bytes: u64,
}

pub(crate) struct State {
    pub(crate) regions: BTreeMap<u64, Arc<RegionCell>>,
    next_id: u64,
    guards: HashMap<Tag, usize>,
    pub(crate) snapshots: BTreeMap<String, Snapshot>,
    resident: u64,
    peak_resident: u64,
}

impl State {
    /// Regions whose tag is in `tags`, in id order.
    pub(crate) fn select(&self, tags: &[Tag]) -> Vec<Arc<RegionCell>> {
        let regions = self.regions.values();
        regions
            .filter(|c| tags.contains(&c.spec.tag))
            .cloned()
            .collect()
    }
}

/// Shared core of a manager (regions point back to it to unregister on drop).
pub(crate) struct Inner {
    config: ManagerConfig,
    state: Mutex<State>,
    guards_dropped: Condvar,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Unregisters a region whose handle was dropped.
    pub(crate) fn forget(&self, id: u64) {
        let mut st = self.lock();
        if let Some(cell) = st.regions.remove(&id)
            && !cell.read().paused
        {
            st.resident -= cell.spec.size as u64;
        }
    }
}

/// Owns the regions of one device in one process. Cheap to clone (shared handle); `Send + Sync`.
#[derive(Debug, Clone)]
pub struct MemoryManager {
    pub(crate) inner: Arc<Inner>,
}

impl MemoryManager {
    /// A manager with the given config.
    pub fn new(config: ManagerConfig) -> Self {
        let state = State {
            regions: BTreeMap::new(),
            next_id: 1,
            guards: HashMap::new(),
            snapshots: BTreeMap::new(),
            resident: 0,
            peak_resident: 0,
        };
        MemoryManager {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(state),
                guards_dropped: Condvar::new(),
            }),
        }
    }

    /// Its config.
    pub fn config(&self) -> &ManagerConfig {
        &self.inner.config
    }

    /// Allocates a resident, zeroed region. Fails with `OverBudget` past the cap.
    pub fn alloc(&self, spec: RegionSpec) -> Result<Region> {
        spec.validate()?;
        let mut st = self.inner.lock();
        self.check_budget(&st, &spec.tag.to_string(), spec.size as u64)?;
        let id = st.next_id;
        st.next_id += 1;
        let cell = Arc::new(RegionCell::new(id, spec)?);
        st.resident += cell.spec.size as u64;
        st.peak_resident = st.peak_resident.max(st.resident);
        st.regions.insert(id, Arc::clone(&cell));
        Ok(Region {
            cell,
            owner: Arc::downgrade(&self.inner),
        })
    }

    fn check_budget(&self, st: &State, tag: &str, requested: u64) -> Result<()> {
        if let Some(cap) = self.inner.config.budget.cap_bytes
            && st.resident + requested > cap
        {
            return Err(MemoryError::OverBudget {
                tag: tag.to_string(),
                requested,
                remaining: cap.saturating_sub(st.resident),
                cap,
                resident: st.resident,
            });
        }
        Ok(())
    }

    /// Pauses every region with one of `tags`; fails at once if a `keep_resident` guard holds
    /// one of them (see the module doc for the full policy).
    pub fn pause(&self, tags: &[Tag]) -> Result<Moved> {
        let mut st = self.inner.lock();
        if let Some((tag, n)) = guarded(&st, tags) {
            return Err(MemoryError::KeptResident { tag, guards: n });
        }
        self.pause_locked(&mut st, tags)
    }

    /// Like [`pause`](Self::pause), but first waits up to `timeout` for guards on `tags` to drop.
    pub fn pause_wait(&self, tags: &[Tag], timeout: Duration) -> Result<Moved> {
        let start = Instant::now();
        let mut st = self.inner.lock();
        while let Some((tag, _)) = guarded(&st, tags) {
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(MemoryError::GuardTimeout { tag, waited });
            }
            let cv = &self.inner.guards_dropped;
            st = cv
                .wait_timeout(st, timeout - waited)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        self.pause_locked(&mut st, tags)
    }

    fn pause_locked(&self, st: &mut State, tags: &[Tag]) -> Result<Moved> {
        let cells = st.select(tags);
        let mut locks = Vec::with_capacity(cells.len());
        for c in &cells {
            let g = c.lock_exclusive()?;
            if g.paused {
                return Err(MemoryError::AlreadyPaused {
                    id: c.id,
                    tag: c.spec.tag.to_string(),
                });
            }
            locks.push(g);
        }
        let mut moved = Moved::default();
        for (c, g) in cells.iter().zip(locks.iter_mut()) {
            c.pause(g, self.inner.config.move_threads)?;
            st.resident -= c.spec.size as u64;
            moved.regions += 1;
            moved.bytes += c.spec.size as u64;
        }
        Ok(moved)
    }

    /// Resumes every region with one of `tags` at its address: bit-exact from the CPU backup, or
    /// zeroed for `discard` regions. Fails if any of them is resident or if it would exceed the
    /// budget.
    pub fn resume(&self, tags: &[Tag]) -> Result<Moved> {
        let mut st = self.inner.lock();
        let cells = st.select(tags);
        let mut locks = Vec::with_capacity(cells.len());
        let mut need = 0u64;
        for c in &cells {
            let g = c.lock_exclusive()?;
            if !g.paused {
                return Err(MemoryError::NotPaused {
                    id: c.id,
                    tag: c.spec.tag.to_string(),
                });
            }
            need += c.spec.size as u64;
            locks.push(g);
        }
        let names: Vec<String> = tags.iter().map(Tag::to_string).collect();
        self.check_budget(&st, &names.join(","), need)?;
        let mut moved = Moved::default();
        for (c, g) in cells.iter().zip(locks.iter_mut()) {
            c.resume(g, self.inner.config.move_threads)?;
            st.resident += c.spec.size as u64;
            st.peak_resident = st.peak_resident.max(st.resident);
            moved.regions += 1;
            moved.bytes += c.spec.size as u64;
        }
        Ok(moved)
    }

    /// Forbids pausing `tags` until the guard is dropped (torch_memory_saver's `disable()`).
    /// Guards nest and count; pausing other tags is unaffected.
    pub fn keep_resident(&self, tags: &[Tag]) -> ResidentGuard {
        let mut st = self.inner.lock();
        for t in tags {
            *st.guards.entry(t.clone()).or_insert(0) += 1;
        }
        ResidentGuard {
            inner: Arc::clone(&self.inner),
            tags: tags.to_vec(),
        }
    }

    /// Resident bytes now (what the budget caps).
    pub fn resident_bytes(&self) -> u64 {
        self.inner.lock().resident
    }

    /// Bytes still allocatable under the cap (`None` when uncapped).
    pub fn remaining_budget(&self) -> Option<u64> {
        let st = self.inner.lock();
        let cap = self.inner.config.budget.cap_bytes?;
        Some(cap.saturating_sub(st.resident))
    }

    /// This process's report for the device ledger.
    pub fn report(&self) -> ProcessReport {
        let st = self.inner.lock();
        ProcessReport {
            process: self.inner.config.process.clone(),
            pid: std::process::id(),
            device: self.inner.config.device.clone(),
            cap_bytes: self.inner.config.budget.cap_bytes,
            regions: st.regions.values().map(|c| c.report()).collect(),
            snapshot_bytes: st.snapshots.values().map(Snapshot::bytes).sum(),
            peak_resident_bytes: st.peak_resident,
        }
    }
}

fn guarded(st: &State, tags: &[Tag]) -> Option<(String, usize)> {
    tags.iter().find_map(|t| match st.guards.get(t) {
        Some(&n) if n > 0 => Some((t.to_string(), n)),
        _ => None,
    })
}

/// While alive, `pause` of its tags fails with `KeptResident` (and `pause_wait` waits).
#[derive(Debug)]
#[must_use = "the guard protects the tags only while it is held"]
pub struct ResidentGuard {
    inner: Arc<Inner>,
    tags: Vec<Tag>,
}

impl ResidentGuard {
    /// The tags it protects.
    pub fn tags(&self) -> &[Tag] {
        &self.tags
    }
}

impl Drop for ResidentGuard {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        for t in &self.tags {
            if let Some(n) = st.guards.get_mut(t) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    st.guards.remove(t);
                }
            }
        }
        drop(st);
        self.inner.guards_dropped.notify_all();
    }
}
