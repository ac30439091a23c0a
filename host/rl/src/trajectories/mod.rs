//! The trajectory ledger: every rollout the run starts, from its start to exactly one end, so
//! that no item is lost, none is trained twice, and none waits forever — across failures,
//! stale data and crashes. Pure bookkeeping (no I/O, no clock): the loop reports what happened
//! and asks what to do next. Not wired into the loop yet; it is the foundation of multi-turn
//! environments (#39, "exactly once, and every rollout ends") and of asynchronous RL with a
//! staleness bound (#44, "nothing lost on resume").
//!
//! ```text
//!  start ─▶ Started ─complete─▶ Completed ─admit─▶ Admitted ─trained─▶ Trained ─durable─▶ Acked
//!             │                  │   ▲               │                    │
//!             │ fail / expire    │   └───release─────┘                    │ restore, step
//!             ▼                  ▼ admit: too stale                       ▼ not durable
//!   Failed (item queued)   Dropped (item queued or dropped)       Failed: Lost (item queued)
//!   or Dropped (no retry left)
//! ```
//!
//! (`Acked` is [`State::Acknowledged`]. A crash ends every trajectory in flight: `restore`
//! acknowledges those whose step is durable; the others are `Failed: Lost`.)
//!
//! An *item* (a prompt and a sample index in its group) is what gets trained; a *trajectory*
//! is one attempt at it, with an id that is assigned in increasing order and never reused. A
//! retry is a new trajectory of the same item whose `retry_of` names the one it replaces.
//!
//! Invariants (checked by the property test in `proptests.rs` over random interleavings of
//! every operation, crashes and restores included):
//! - **One end each.** A trajectory is in flight (started, completed, admitted, trained) or has
//!   exactly one terminal state: failed, dropped or acknowledged. At any time `started =
//!   acknowledged + failed + dropped_failed + dropped_stale + in_flight` ([`Counters`]).
//! - **One trajectory per item at a time**, and an item runs again only from `Pending`: an
//!   acknowledged or dropped item is refused by `start`, so no item is trained (acknowledged)
//!   twice.
//! - **Nothing waits forever.** `fail` and `expire` (a trajectory in flight for at least the
//!   deadline, in the caller's ticks) end a trajectory and queue its item again while its retry
//!   budget lasts, else drop the item — recorded either way. Completed trajectories either get
//!   admitted or become too stale and are handled by the [`StalePolicy`].
//! - **The staleness bound is guaranteed.** `admit(train_version, k, max_batch)` returns only
//!   trajectories whose oldest token's version is at least `train_version - k` (k = 0 is the
//!   synchronous loop); the over-stale ones are dropped (and their item regenerated or dropped)
//!   in the same call, never left waiting.
//! - **Exactly once across a crash.** An item is consumed (acknowledged) only once the step
//!   that trained it is durable. [`Ledger::snapshot`] is saved with each checkpoint;
//!   [`Ledger::restore`] with the checkpoint's step acknowledges what that step trained and
//!   turns every other trajectory in flight into `Failed(Lost)`, queuing its item again (not
//!   counted against the retry budget). Items the snapshot never saw are started fresh from
//!   the dataset position saved beside it. Running on from there acknowledges every item once:
//!   what an uninterrupted run would train.
//!
//! How the loop will use it: for #39, an environment or engine that dies mid-trajectory is a
//! `fail` (a hang is an `expire`); the counters go to `metrics.jsonl` per step and at the end
//! `started = acknowledged + failed + dropped_*` (nothing in flight). For #44, each token's
//! policy version comes back with `complete`, the trainer takes its batch with `admit` (the
//! staleness histogram feeds `tandem bench async`), calls `trained` after the step and
//! `durable` once its checkpoint is on disk; `--resume` calls `restore` and regenerates the
//! items it returns before new ones.

mod admit;
mod error;
mod snapshot;
mod types;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use admit::{Admission, Admitted, StaleOutcome};
pub use error::LedgerError;
pub use snapshot::LedgerState;
pub use types::{
    Completion, Counters, DropReason, FailReason, Item, ItemEntry, ItemStatus, LedgerConfig,
    StalePolicy, State, Trajectory, TrajectoryId,
};

use std::collections::{BTreeMap, VecDeque};

/// What became of an item whose trajectory failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// The item is queued to run again (as a retry of the failed trajectory).
    Retry(Item),
    /// The item had no retry left and is dropped.
    Dropped(Item),
}

/// The ledger of one run's trajectories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    config: LedgerConfig,
    next_id: u64,
    trajectories: BTreeMap<TrajectoryId, Trajectory>,
    items: BTreeMap<Item, ItemEntry>,
    /// Items to (re)generate, oldest first.
    pending: VecDeque<Item>,
    /// Completed trajectories waiting for admission, in completion order.
    completed: VecDeque<TrajectoryId>,
    durable_step: Option<u64>,
    counters: Counters,
    /// Admissions by staleness (train version minus the oldest token's version).
    staleness: BTreeMap<u64, u64>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new(config: LedgerConfig) -> Self {
        Ledger {
            config,
            next_id: 0,
            trajectories: BTreeMap::new(),
            items: BTreeMap::new(),
            pending: VecDeque::new(),
            completed: VecDeque::new(),
            durable_step: None,
            counters: Counters::default(),
            staleness: BTreeMap::new(),
        }
    }

    /// Its settings.
    pub fn config(&self) -> LedgerConfig {
        self.config
    }

    /// The counters for metrics.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Admissions by staleness in versions (for the staleness histogram).
    pub fn staleness_histogram(&self) -> &BTreeMap<u64, u64> {
        &self.staleness
    }

    /// The latest durable step.
    pub fn durable_step(&self) -> Option<u64> {
        self.durable_step
    }

    /// A trajectory's record.
    pub fn trajectory(&self, id: TrajectoryId) -> Option<&Trajectory> {
        self.trajectories.get(&id)
    }

    /// Every trajectory's record, in id order.
    pub fn trajectories(&self) -> impl Iterator<Item = &Trajectory> {
        self.trajectories.values()
    }

    /// An item's entry, if the ledger has seen it.
    pub fn item(&self, item: Item) -> Option<ItemEntry> {
        self.items.get(&item).copied()
    }

    /// Every item the ledger has seen, in order.
    pub fn items(&self) -> impl Iterator<Item = (&Item, &ItemEntry)> {
        self.items.iter()
    }

    /// The items queued to be (re)generated, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = &Item> {
        self.pending.iter()
    }

    /// Starts a trajectory of `item` on an engine holding policy `version`, at the caller's
    /// tick `now`. A new item starts its first attempt; a pending one its retry (linked to its
    /// last trajectory). An item in flight, acknowledged or dropped is refused.
    pub fn start(
        &mut self,
        item: Item,
        version: u64,
        now: u64,
    ) -> Result<TrajectoryId, LedgerError> {
        let retry_of = match self.items.get(&item).map(|e| e.status) {
            None => None,
            Some(ItemStatus::Pending { retry_of }) => Some(retry_of),
            Some(status) => {
                return Err(LedgerError::ItemNotStartable {
                    item,
                    status: status.name(),
                });
            }
        };
        let id = TrajectoryId(self.next_id);
        self.next_id += 1;
        if retry_of.is_some() {
            self.pending.retain(|p| *p != item);
            self.counters.pending -= 1;
            self.counters.retried += 1;
        }
        let entry = self.items.entry(item).or_insert(ItemEntry {
            status: ItemStatus::Live(id),
            retries: 0,
        });
        entry.status = ItemStatus::Live(id);
        self.trajectories.insert(
            id,
            Trajectory {
                id,
                item,
                retry_of,
                start_version: version,
                started_at: now,
                state: State::Started,
            },
        );
        self.counters.started += 1;
        self.counters.in_flight += 1;
        Ok(id)
    }

    /// Starts the oldest pending item, if any (see [`Ledger::start`]).
    pub fn start_pending(&mut self, version: u64, now: u64) -> Option<(TrajectoryId, Item)> {
        let item = *self.pending.front()?;
        self.start(item, version, now).ok().map(|id| (id, item))
    }

    /// Records that a started trajectory finished generating.
    pub fn complete(
        &mut self,
        id: TrajectoryId,
        completion: Completion,
    ) -> Result<(), LedgerError> {
        let t = self.started(id, "complete")?;
        if completion.oldest_version < t.start_version
            || completion.newest_version < completion.oldest_version
        {
            return Err(LedgerError::BadVersions {
                id,
                start: t.start_version,
                oldest: completion.oldest_version,
                newest: completion.newest_version,
            });
        }
        t.state = State::Completed(completion);
        self.completed.push_back(id);
        self.counters.completed += 1;
        Ok(())
    }

    /// Records that a started trajectory failed: its item is queued again as a retry while its
    /// budget lasts, else dropped.
    pub fn fail(
        &mut self,
        id: TrajectoryId,
        reason: impl Into<String>,
    ) -> Result<FailOutcome, LedgerError> {
        let item = self.started(id, "fail")?.item;
        Ok(self.end_failed(id, item, FailReason::Error(reason.into())))
    }

    /// Fails every trajectory started at least the deadline before tick `now` (a rollout that
    /// never returns), in id order.
    pub fn expire(&mut self, now: u64) -> Vec<(TrajectoryId, FailOutcome)> {
        let overdue: Vec<(TrajectoryId, Item, u64)> = self
            .trajectories
            .values()
            .filter(|t| t.state == State::Started)
            .map(|t| (t.id, t.item, now.saturating_sub(t.started_at)))
            .filter(|(_, _, age)| *age >= self.config.deadline)
            .collect();
        overdue
            .into_iter()
            .map(|(id, item, age)| (id, self.end_failed(id, item, FailReason::Expired { age })))
            .collect()
    }

    /// The record of a trajectory that must be `Started` for `op`.
    fn started(
        &mut self,
        id: TrajectoryId,
        op: &'static str,
    ) -> Result<&mut Trajectory, LedgerError> {
        let t = self
            .trajectories
            .get_mut(&id)
            .ok_or(LedgerError::UnknownTrajectory { id })?;
        if t.state != State::Started {
            return Err(LedgerError::IllegalTransition {
                op,
                id,
                state: t.state.name(),
                fix: "only a trajectory in flight (started) completes, fails or expires",
            });
        }
        Ok(t)
    }

    /// Ends a started trajectory of `item` as failed: retry or drop the item.
    fn end_failed(&mut self, id: TrajectoryId, item: Item, failure: FailReason) -> FailOutcome {
        self.counters.in_flight -= 1;
        let (state, outcome) = if self.take_retry(item, id) {
            self.counters.failed += 1;
            (State::Failed(failure), FailOutcome::Retry(item))
        } else {
            let attempts = self.items.get(&item).map_or(1, |e| e.retries + 1);
            self.counters.dropped_failed += 1;
            let reason = DropReason::RetriesExhausted { failure, attempts };
            (State::Dropped(reason), FailOutcome::Dropped(item))
        };
        self.set_state(id, state);
        outcome
    }

    /// Sets a known trajectory's state.
    fn set_state(&mut self, id: TrajectoryId, state: State) {
        if let Some(t) = self.trajectories.get_mut(&id) {
            t.state = state;
        }
    }

    /// Spends one of `item`'s retries and queues it as a retry of `last`; without a retry
    /// left, drops the item. Whether it was queued.
    fn take_retry(&mut self, item: Item, last: TrajectoryId) -> bool {
        let budget = self.config.retry_budget;
        let Some(entry) = self.items.get_mut(&item) else {
            return false;
        };
        if entry.retries < budget {
            entry.retries += 1;
            self.queue(item, last);
            true
        } else {
            entry.status = ItemStatus::Dropped(last);
            self.counters.items_dropped += 1;
            false
        }
    }

    /// Queues `item` to run again as a retry of `last` (its retries unchanged).
    fn queue(&mut self, item: Item, last: TrajectoryId) {
        if let Some(entry) = self.items.get_mut(&item) {
            entry.status = ItemStatus::Pending { retry_of: last };
        }
        self.pending.push_back(item);
        self.counters.pending += 1;
    }
}
