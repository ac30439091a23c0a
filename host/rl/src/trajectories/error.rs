//! The ledger's errors: each a refused call, in one line that names the trajectory or item,
//! where it is, and what the caller does instead. A refused call changes nothing.

use super::types::{Item, TrajectoryId};

/// A call the ledger refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The id was never assigned by this ledger.
    #[error(
        "trajectory ledger: no trajectory {id} (ids come from `start`; after a restore, use the \
         restored ledger's ids)"
    )]
    UnknownTrajectory {
        /// The id.
        id: TrajectoryId,
    },
    /// The operation does not apply to the trajectory's state.
    #[error("trajectory ledger: `{op}` of trajectory {id} in state {state} refused: {fix}")]
    IllegalTransition {
        /// The operation.
        op: &'static str,
        /// The trajectory.
        id: TrajectoryId,
        /// Its state.
        state: &'static str,
        /// What the caller does instead.
        fix: &'static str,
    },
    /// The item cannot be started: it is in flight, acknowledged or dropped.
    #[error(
        "trajectory ledger: `start` of {item} refused: it is {status} (an item runs once at a \
         time and never again once acknowledged or dropped)"
    )]
    ItemNotStartable {
        /// The item.
        item: Item,
        /// Its status.
        status: &'static str,
    },
    /// A completion's versions are out of order.
    #[error(
        "trajectory ledger: `complete` of trajectory {id} refused: token versions \
         {oldest}..{newest} with start version {start} (need start <= oldest <= newest)"
    )]
    BadVersions {
        /// The trajectory.
        id: TrajectoryId,
        /// Its start version.
        start: u64,
        /// The reported oldest version.
        oldest: u64,
        /// The reported newest version.
        newest: u64,
    },
    /// A step at or before the durable one cannot train anything more.
    #[error(
        "trajectory ledger: `trained` at step {step} refused: step {durable} is already durable \
         (train into a later step)"
    )]
    StepAlreadyDurable {
        /// The step given.
        step: u64,
        /// The latest durable step.
        durable: u64,
    },
    /// The same id appears twice in one `trained` call.
    #[error("trajectory ledger: `trained` lists trajectory {id} twice (list each once)")]
    DuplicateInBatch {
        /// The id.
        id: TrajectoryId,
    },
    /// A snapshot that does not hold together (or is newer than the checkpoint resumed).
    #[error("trajectory ledger: the snapshot cannot be restored: {what}")]
    InvalidSnapshot {
        /// What is wrong with it.
        what: String,
    },
}
