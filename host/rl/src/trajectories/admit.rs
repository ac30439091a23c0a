//! The trainer's side of the ledger: admission under the staleness bound, the step that
//! trained a batch, a batch handed back untrained, and the durable step that acknowledges it.

use super::Ledger;
use super::error::LedgerError;
use super::types::{Completion, DropReason, Item, ItemStatus, StalePolicy, State, TrajectoryId};
use std::collections::BTreeSet;

/// A trajectory admitted into a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// The trajectory.
    pub id: TrajectoryId,
    /// What it samples.
    pub item: Item,
    /// What it generated.
    pub completion: Completion,
    /// Versions between its oldest token and the version being trained (at most the bound).
    pub staleness: u64,
}

/// A completed trajectory admission dropped as too stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleOutcome {
    /// The trajectory.
    pub id: TrajectoryId,
    /// What it samples.
    pub item: Item,
    /// Its staleness (more than the bound).
    pub staleness: u64,
    /// Whether its item was queued again (else it is dropped).
    pub regenerated: bool,
}

/// What one `admit` call decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    /// The batch, in completion order.
    pub admitted: Vec<Admitted>,
    /// The over-stale trajectories it dropped.
    pub stale: Vec<StaleOutcome>,
}

impl Ledger {
    /// Admits up to `max_batch` completed trajectories, in completion order, into the batch
    /// of the step training policy `train_version`: only those whose oldest token's version is
    /// at least `train_version - max_staleness`. Every completed trajectory older than that is
    /// dropped in the same call, its item queued again ([`StalePolicy::Regenerate`], within its
    /// retry budget) or dropped. Those not admitted for lack of room stay completed.
    pub fn admit(&mut self, train_version: u64, max_staleness: u64, max_batch: usize) -> Admission {
        let mut admission = Admission::default();
        let waiting = std::mem::take(&mut self.completed);
        for id in waiting {
            let Some(t) = self.trajectories.get(&id) else {
                continue;
            };
            let (item, completion) = match &t.state {
                State::Completed(c) => (t.item, *c),
                _ => continue,
            };
            let staleness = train_version.saturating_sub(completion.oldest_version);
            if staleness > max_staleness {
                admission.stale.push(self.drop_stale(
                    id,
                    item,
                    completion,
                    train_version,
                    max_staleness,
                ));
            } else if admission.admitted.len() < max_batch {
                self.set_state(
                    id,
                    State::Admitted {
                        completion,
                        train_version,
                    },
                );
                self.counters.admitted += 1;
                *self.staleness.entry(staleness).or_insert(0) += 1;
                admission.admitted.push(Admitted {
                    id,
                    item,
                    completion,
                    staleness,
                });
            } else {
                self.completed.push_back(id);
            }
        }
        admission
    }

    /// Drops a too-stale completed trajectory under the stale policy.
    fn drop_stale(
        &mut self,
        id: TrajectoryId,
        item: Item,
        completion: Completion,
        train_version: u64,
        max_staleness: u64,
    ) -> StaleOutcome {
        self.counters.in_flight -= 1;
        self.counters.dropped_stale += 1;
        let regenerated = match self.config.stale_policy {
            StalePolicy::Regenerate => self.take_retry(item, id),
            StalePolicy::Drop => {
                if let Some(entry) = self.items.get_mut(&item) {
                    entry.status = ItemStatus::Dropped(id);
                }
                self.counters.items_dropped += 1;
                false
            }
        };
        self.set_state(
            id,
            State::Dropped(DropReason::Stale {
                oldest_version: completion.oldest_version,
                train_version,
                max_staleness,
                regenerated,
            }),
        );
        StaleOutcome {
            id,
            item,
            staleness: train_version.saturating_sub(completion.oldest_version),
            regenerated,
        }
    }

    /// Records that train step `step` trained the admitted trajectories `ids` (all or none:
    /// one that is not admitted refuses the call). The step must come after the durable one.
    pub fn trained(&mut self, step: u64, ids: &[TrajectoryId]) -> Result<(), LedgerError> {
        if let Some(durable) = self.durable_step.filter(|d| step <= *d) {
            return Err(LedgerError::StepAlreadyDurable { step, durable });
        }
        let mut seen = BTreeSet::new();
        for &id in ids {
            if !seen.insert(id) {
                return Err(LedgerError::DuplicateInBatch { id });
            }
            self.admitted(id, "trained")?;
        }
        for &id in ids {
            if let Some(State::Admitted { completion, .. }) = self.trajectory(id).map(|t| &t.state)
            {
                let completion = *completion;
                self.set_state(id, State::Trained { completion, step });
                self.counters.trained += 1;
            }
        }
        Ok(())
    }

    /// Hands an admitted trajectory back untrained (its step failed): it waits for admission
    /// again, first in line, and is checked against the bound again.
    pub fn release(&mut self, id: TrajectoryId) -> Result<(), LedgerError> {
        let completion = self.admitted(id, "release")?;
        self.set_state(id, State::Completed(completion));
        self.completed.push_front(id);
        Ok(())
    }

    /// Records that train step `step` (and every one before it) is durable: every trajectory
    /// trained by such a step is acknowledged and its item consumed. Returns those ids.
    /// An earlier step than the durable one changes nothing.
    pub fn durable(&mut self, step: u64) -> Vec<TrajectoryId> {
        self.durable_step = Some(self.durable_step.map_or(step, |d| d.max(step)));
        let due: Vec<(TrajectoryId, Item)> = self
            .trajectories
            .values()
            .filter(|t| matches!(t.state, State::Trained { step: s, .. } if s <= step))
            .map(|t| (t.id, t.item))
            .collect();
        for &(id, item) in &due {
            self.acknowledge(id, item);
        }
        due.into_iter().map(|(id, _)| id).collect()
    }

    /// Acknowledges a trained trajectory.
    pub(super) fn acknowledge(&mut self, id: TrajectoryId, item: Item) {
        if let Some(t) = self.trajectories.get_mut(&id)
            && let State::Trained { completion, step } = t.state
        {
            t.state = State::Acknowledged { completion, step };
            if let Some(entry) = self.items.get_mut(&item) {
                entry.status = ItemStatus::Acknowledged(id);
            }
            self.counters.acknowledged += 1;
            self.counters.in_flight -= 1;
        }
    }

    /// The completion of a trajectory that must be `Admitted` for `op`.
    fn admitted(&self, id: TrajectoryId, op: &'static str) -> Result<Completion, LedgerError> {
        let t = self
            .trajectory(id)
            .ok_or(LedgerError::UnknownTrajectory { id })?;
        match t.state {
            State::Admitted { completion, .. } => Ok(completion),
            ref other => Err(LedgerError::IllegalTransition {
                op,
                id,
                state: other.name(),
                fix: "only what `admit` returned, not yet trained, is trained or released",
            }),
        }
    }
}
