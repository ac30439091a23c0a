//! The ledger's vocabulary: trajectory ids, the items they sample, the states of a trajectory
//! and of an item, the reasons a trajectory fails or is dropped, and the counters for metrics.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A trajectory's id: assigned by the ledger in increasing order, never reused (not even
/// across a restore: the counter is part of the snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TrajectoryId(pub u64);

impl fmt::Display for TrajectoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a trajectory samples: a prompt and the index of the sample in its group. An item is
/// trained at most once; its trajectories are its attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Item {
    /// The prompt's id.
    pub prompt: u64,
    /// The sample's index within the prompt's group.
    pub sample: u32,
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "prompt {} sample {}", self.prompt, self.sample)
    }
}

/// What a finished generation reports: its token count and the policy versions of its oldest
/// and newest tokens (they differ when weights were updated while it was in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// Tokens generated.
    pub tokens: u64,
    /// The policy version of its oldest token: what admission measures staleness by.
    pub oldest_version: u64,
    /// The policy version of its newest token.
    pub newest_version: u64,
}

/// Why a trajectory failed (and its item was queued again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailReason {
    /// The caller's reason: an engine or environment died, a tool call failed, ...
    Error(String),
    /// In flight for `age` ticks, at least the ledger's deadline.
    Expired {
        /// Ticks since it started.
        age: u64,
    },
    /// Not acknowledged when the run crashed: found by `restore`, re-run without counting
    /// against the item's retry budget.
    Lost,
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailReason::Error(e) => f.write_str(e),
            FailReason::Expired { age } => write!(f, "expired after {age} ticks in flight"),
            FailReason::Lost => f.write_str("lost in flight by a crash"),
        }
    }
}

/// Why a trajectory was dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DropReason {
    /// It failed and its item had no retry left: the item is dropped with it.
    RetriesExhausted {
        /// The failure.
        failure: FailReason,
        /// Attempts the item had (the first and its retries).
        attempts: u32,
    },
    /// Completed, but its oldest token was more than `max_staleness` versions behind the
    /// version being trained.
    Stale {
        /// Its oldest token's version.
        oldest_version: u64,
        /// The version being trained.
        train_version: u64,
        /// The bound.
        max_staleness: u64,
        /// Whether its item was queued again ([`StalePolicy::Regenerate`] with a retry
        /// left).
        regenerated: bool,
    },
}

/// What admission does with a completed trajectory that is too stale to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StalePolicy {
    /// Drop it and queue its item again (within the item's retry budget).
    Regenerate,
    /// Drop it and its item.
    Drop,
}

/// The ledger's fixed settings, chosen at construction and kept in the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerConfig {
    /// Retries an item gets after its first attempt (failures, expiries and stale
    /// regenerations count; re-runs after a crash do not).
    pub retry_budget: u32,
    /// What admission does with over-stale completed trajectories.
    pub stale_policy: StalePolicy,
    /// `expire` fails a trajectory in flight for at least this many ticks.
    pub deadline: u64,
}

/// Where a trajectory is. `Failed`, `Dropped` and `Acknowledged` are terminal; the others are
/// in flight (counted by [`Counters::in_flight`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// Generating.
    Started,
    /// Generated, waiting for admission.
    Completed(Completion),
    /// Admitted into the batch of the step training `train_version`.
    Admitted {
        /// What it generated.
        completion: Completion,
        /// The version being trained.
        train_version: u64,
    },
    /// Trained by `step`, which is not durable yet.
    Trained {
        /// What it generated.
        completion: Completion,
        /// The train step.
        step: u64,
    },
    /// Trained by `step`, and `step` is durable: its item is consumed.
    Acknowledged {
        /// What it generated.
        completion: Completion,
        /// The train step.
        step: u64,
    },
    /// Failed; its item was queued again.
    Failed(FailReason),
    /// Dropped (see the reason for whether its item was queued again).
    Dropped(DropReason),
}

impl State {
    /// The state's name in errors.
    pub fn name(&self) -> &'static str {
        match self {
            State::Started => "started",
            State::Completed(_) => "completed",
            State::Admitted { .. } => "admitted",
            State::Trained { .. } => "trained",
            State::Acknowledged { .. } => "acknowledged",
            State::Failed(_) => "failed",
            State::Dropped(_) => "dropped",
        }
    }

    /// Whether the trajectory has ended (failed, dropped or acknowledged).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            State::Failed(_) | State::Dropped(_) | State::Acknowledged { .. }
        )
    }
}

/// One trajectory's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Its id.
    pub id: TrajectoryId,
    /// What it samples.
    pub item: Item,
    /// The trajectory of the same item it re-runs, if any.
    pub retry_of: Option<TrajectoryId>,
    /// The policy version of the engine when it started.
    pub start_version: u64,
    /// The caller's tick when it started (for `expire`).
    pub started_at: u64,
    /// Where it is.
    pub state: State,
}

/// Where an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ItemStatus {
    /// A trajectory of it is in flight.
    Live(TrajectoryId),
    /// Queued to be (re)generated; `retry_of` is its last trajectory.
    Pending {
        /// Its last trajectory.
        retry_of: TrajectoryId,
    },
    /// Trained by this trajectory in a durable step: consumed, never run again.
    Acknowledged(TrajectoryId),
    /// Dropped with this trajectory: never run again.
    Dropped(TrajectoryId),
}

impl ItemStatus {
    /// The status's name in errors.
    pub fn name(self) -> &'static str {
        match self {
            ItemStatus::Live(_) => "in flight",
            ItemStatus::Pending { .. } => "pending",
            ItemStatus::Acknowledged(_) => "acknowledged",
            ItemStatus::Dropped(_) => "dropped",
        }
    }
}

/// An item's entry in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemEntry {
    /// Where it is.
    pub status: ItemStatus,
    /// Retries spent from its budget.
    pub retries: u32,
}

/// Cumulative counts of transitions (and the `in_flight` / `pending` gauges), for
/// `metrics.jsonl`. At any time `started = acknowledged + failed + dropped_failed +
/// dropped_stale + in_flight`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Trajectories started (first attempts and retries).
    pub started: u64,
    /// Trajectories that completed generation.
    pub completed: u64,
    /// Trajectories failed whose item was queued again (including those lost in a crash).
    pub failed: u64,
    /// Of `failed`: lost in flight by a crash (found by `restore`).
    pub lost: u64,
    /// Retry trajectories started.
    pub retried: u64,
    /// Completed trajectories dropped as too stale.
    pub dropped_stale: u64,
    /// Trajectories failed with no retry left.
    pub dropped_failed: u64,
    /// Items dropped (never to be trained).
    pub items_dropped: u64,
    /// Trajectories admitted into a batch.
    pub admitted: u64,
    /// Trajectories trained (by a step, durable or not).
    pub trained: u64,
    /// Trajectories acknowledged (their step durable).
    pub acknowledged: u64,
    /// Trajectories not yet terminal (gauge).
    pub in_flight: u64,
    /// Items queued to be (re)generated (gauge).
    pub pending: u64,
}
