//! Checkpoint and resume: the ledger's whole state as a serializable value, saved with each
//! checkpoint, and the restore after a crash that acknowledges what the resumed checkpoint's
//! step trained and queues every other trajectory in flight to run again.

use super::Ledger;
use super::error::LedgerError;
use super::types::{
    Counters, FailReason, Item, ItemEntry, ItemStatus, LedgerConfig, State, Trajectory,
    TrajectoryId,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The ledger's state, as saved with a checkpoint (plain lists, so any serde format holds it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerState {
    /// Its settings.
    pub config: LedgerConfig,
    /// The next id to assign.
    pub next_id: u64,
    /// Every trajectory, in id order.
    pub trajectories: Vec<Trajectory>,
    /// Every item seen, in order.
    pub items: Vec<(Item, ItemEntry)>,
    /// Items to (re)generate, oldest first.
    pub pending: Vec<Item>,
    /// Completed trajectories waiting for admission, in completion order.
    pub completed: Vec<TrajectoryId>,
    /// The latest durable step when saved.
    pub durable_step: Option<u64>,
    /// The counters.
    pub counters: Counters,
    /// Admissions by staleness.
    pub staleness: Vec<(u64, u64)>,
}

impl Ledger {
    /// The state to save with a checkpoint.
    pub fn snapshot(&self) -> LedgerState {
        LedgerState {
            config: self.config,
            next_id: self.next_id,
            trajectories: self.trajectories.values().cloned().collect(),
            items: self.items.iter().map(|(i, e)| (*i, *e)).collect(),
            pending: self.pending.iter().copied().collect(),
            completed: self.completed.iter().copied().collect(),
            durable_step: self.durable_step,
            counters: self.counters,
            staleness: self.staleness.iter().map(|(s, n)| (*s, *n)).collect(),
        }
    }

    /// The ledger after a crash, from the `state` saved with the checkpoint the run resumes
    /// from, `durable_step` being that checkpoint's step (`None`: no step is durable). What
    /// that step (or an earlier one) trained is acknowledged; every other trajectory not
    /// acknowledged was lost in flight: it becomes `Failed(Lost)` and its item is queued
    /// again, outside its retry budget. Returns the ledger and every pending item, oldest
    /// first: regenerate them before new items. Refuses a state that does not hold together,
    /// or one that acknowledges a step after `durable_step` (a snapshot newer than the
    /// checkpoint).
    pub fn restore(
        state: LedgerState,
        durable_step: Option<u64>,
    ) -> Result<(Ledger, Vec<Item>), LedgerError> {
        let mut ledger = load(state)?;
        let newest_ack = ledger
            .trajectories
            .values()
            .filter_map(|t| match t.state {
                State::Acknowledged { step, .. } => Some(step),
                _ => None,
            })
            .max();
        if let Some(step) = newest_ack.filter(|s| durable_step.is_none_or(|d| *s > d)) {
            return Err(LedgerError::InvalidSnapshot {
                what: format!(
                    "it acknowledges step {step}, after the resumed checkpoint's step {} (restore \
                     the snapshot saved with that checkpoint)",
                    durable_step.map_or("(none)".to_owned(), |d| d.to_string())
                ),
            });
        }
        ledger.durable_step = durable_step;
        let open: Vec<(TrajectoryId, Item, Option<u64>)> = ledger
            .trajectories
            .values()
            .filter(|t| !t.state.is_terminal())
            .map(|t| match t.state {
                State::Trained { step, .. } => (t.id, t.item, Some(step)),
                _ => (t.id, t.item, None),
            })
            .collect();
        for (id, item, trained) in open {
            match (trained, durable_step) {
                (Some(step), Some(durable)) if step <= durable => ledger.acknowledge(id, item),
                _ => {
                    ledger.set_state(id, State::Failed(FailReason::Lost));
                    ledger.counters.in_flight -= 1;
                    ledger.counters.failed += 1;
                    ledger.counters.lost += 1;
                    ledger.queue(item, id);
                }
            }
        }
        ledger.completed.clear();
        let pending = ledger.pending.iter().copied().collect();
        Ok((ledger, pending))
    }
}

/// The ledger a state describes, once checked to hold together.
fn load(state: LedgerState) -> Result<Ledger, LedgerError> {
    let bad = |what: String| Err(LedgerError::InvalidSnapshot { what });
    let mut trajectories = BTreeMap::new();
    for t in state.trajectories {
        if t.id.0 >= state.next_id {
            return bad(format!(
                "trajectory {} is not below the next id {}",
                t.id, state.next_id
            ));
        }
        let id = t.id;
        if trajectories.insert(id, t).is_some() {
            return bad(format!("trajectory {id} appears twice"));
        }
    }
    let mut items = BTreeMap::new();
    for (item, entry) in state.items {
        let named = match entry.status {
            ItemStatus::Live(id)
            | ItemStatus::Pending { retry_of: id }
            | ItemStatus::Acknowledged(id)
            | ItemStatus::Dropped(id) => id,
        };
        match trajectories.get(&named) {
            Some(t) if t.item == item => {}
            _ => {
                return bad(format!(
                    "{item} names trajectory {named}, which is not one of its"
                ));
            }
        }
        if items.insert(item, entry).is_some() {
            return bad(format!("{item} appears twice"));
        }
    }
    for t in trajectories.values() {
        let status = items.get(&t.item).map(|e| e.status);
        let consistent = match (&t.state, status) {
            (_, None) => false,
            (s, Some(ItemStatus::Live(id))) if !s.is_terminal() => id == t.id,
            (s, Some(_)) if !s.is_terminal() => false,
            (State::Acknowledged { step, .. }, Some(ItemStatus::Acknowledged(id))) => {
                if state.durable_step.is_none_or(|d| *step > d) {
                    return bad(format!(
                        "trajectory {} is acknowledged at step {step}, after the durable step",
                        t.id
                    ));
                }
                id == t.id
            }
            (State::Acknowledged { .. }, Some(_)) => false,
            _ => true,
        };
        if !consistent {
            return bad(format!(
                "trajectory {} is {} but {} is not recorded with it",
                t.id,
                t.state.name(),
                t.item
            ));
        }
    }
    let pending_set: BTreeSet<Item> = state.pending.iter().copied().collect();
    let queued: BTreeSet<Item> = items
        .iter()
        .filter(|(_, e)| matches!(e.status, ItemStatus::Pending { .. }))
        .map(|(i, _)| *i)
        .collect();
    if pending_set != queued || pending_set.len() != state.pending.len() {
        return bad("the pending queue and the pending items differ".to_owned());
    }
    let completed_set: BTreeSet<TrajectoryId> = state.completed.iter().copied().collect();
    let waiting: BTreeSet<TrajectoryId> = trajectories
        .values()
        .filter(|t| matches!(t.state, State::Completed(_)))
        .map(|t| t.id)
        .collect();
    if completed_set != waiting || completed_set.len() != state.completed.len() {
        return bad("the admission queue and the completed trajectories differ".to_owned());
    }
    let in_flight = trajectories
        .values()
        .filter(|t| !t.state.is_terminal())
        .count() as u64;
    if state.counters.in_flight != in_flight || state.counters.pending != state.pending.len() as u64
    {
        return bad("the in-flight or pending counter disagrees with the records".to_owned());
    }
    Ok(Ledger {
        config: state.config,
        next_id: state.next_id,
        trajectories,
        items,
        pending: VecDeque::from(state.pending),
        completed: VecDeque::from(state.completed),
        durable_step: state.durable_step,
        counters: state.counters,
        staleness: state.staleness.into_iter().collect(),
    })
}
