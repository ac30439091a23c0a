//! The bubble coordinator: where each engine rank is in a step's rollout, and when the idle
//! ("bubble") time of the ranks that finished early may go to drafter training (seed 000).
//!
//! ```text
//!  Idle ──start──▶ Generating ──finish──▶ Released ──train──▶ Training
//!   ▲                                      │   ▲                 │
//!   │                                      │   └─stop_training───┤
//!   │                                      ▼                     │
//!   └───────reset────────────────────  Completed ◀──complete─────┘
//! ```
//!
//! `Released`: the rank's share of the rollout is done while other ranks may still generate
//! (its bubble begins). `Completed`: the rollout is over for every rank. The rules, checked on
//! every call (a refused call changes nothing and its error names the rank, its state and the
//! operation):
//! - a rank trains only once its engine finished its share (`Released`), never while a
//!   drafter sync is under way, and only when at least `min_ranks_for_training` ranks are
//!   released or training;
//! - `complete` only once no rank generates: training ends with the last engine's share;
//! - the policy's train phase only when every rank is `Completed`
//!   ([`Coordinator::policy_may_train`]);
//! - a drafter sync begins only when no rank trains, and ends before the next one begins.
//!
//! The loop drives `start`, `finish` and `complete` for every rank of every step and logs each
//! transition to `events.jsonl`; [`BubbleTimes`] turns the ranks' finish times into the tail
//! and the bubble time of the step.

mod times;

#[cfg(test)]
mod tests;

pub use times::BubbleTimes;

use std::fmt;

/// Where an engine rank is in the step's rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankState {
    /// Before the rollout.
    Idle,
    /// Its engine generates its share.
    Generating,
    /// Its share is done; other ranks may still generate.
    Released,
    /// Its drafter trainer trains in the bubble.
    Training,
    /// The rollout is over.
    Completed,
}

impl RankState {
    /// The name in events and errors.
    pub fn name(self) -> &'static str {
        match self {
            RankState::Idle => "idle",
            RankState::Generating => "generating",
            RankState::Released => "released",
            RankState::Training => "training",
            RankState::Completed => "completed",
        }
    }
}

impl fmt::Display for RankState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An operation on the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BubbleOp {
    /// The rank's engine starts its share of the rollout.
    Start,
    /// The rank's engine returned its share.
    Finish,
    /// The rank's drafter trainer starts training.
    Train,
    /// The rank's drafter trainer stops (its step budget is spent).
    StopTraining,
    /// The rollout is over for the rank.
    Complete,
    /// Back to `Idle` for the next step.
    Reset,
    /// The trained drafter starts going to the engines.
    BeginSync,
    /// The drafter sync ended (applied or failed).
    EndSync,
}

impl fmt::Display for BubbleOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BubbleOp::Start => "start",
            BubbleOp::Finish => "finish",
            BubbleOp::Train => "train",
            BubbleOp::StopTraining => "stop_training",
            BubbleOp::Complete => "complete",
            BubbleOp::Reset => "reset",
            BubbleOp::BeginSync => "begin_sync",
            BubbleOp::EndSync => "end_sync",
        })
    }
}

/// A refused operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bubble coordinator: `{op}`{} refused: {why}", rank_in(*.rank, *.state))]
pub struct BubbleError {
    /// The operation.
    pub op: BubbleOp,
    /// The rank it named (`None` for the drafter sync).
    pub rank: Option<usize>,
    /// That rank's state, which it keeps.
    pub state: Option<RankState>,
    /// Why.
    pub why: String,
}

fn rank_in(rank: Option<usize>, state: Option<RankState>) -> String {
    match (rank, state) {
        (Some(r), Some(s)) => format!(" of rank {r} in state {s}"),
        (Some(r), None) => format!(" of rank {r}"),
        _ => String::new(),
    }
}

/// Every rank's state and whether a drafter sync is under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinator {
    ranks: Vec<RankState>,
    syncing: bool,
    min_ranks_for_training: usize,
}

impl Coordinator {
    /// `ranks` engine ranks, all `Idle`; training needs `min_ranks_for_training` (at least 1)
    /// ranks released or training.
    pub fn new(ranks: usize, min_ranks_for_training: usize) -> Coordinator {
        Coordinator {
            ranks: vec![RankState::Idle; ranks],
            syncing: false,
            min_ranks_for_training: min_ranks_for_training.max(1),
        }
    }

    /// Every rank's state, by rank.
    pub fn states(&self) -> &[RankState] {
        &self.ranks
    }

    /// Whether a drafter sync is under way.
    pub fn syncing(&self) -> bool {
        self.syncing
    }

    /// The policy's train phase may run: every rank's rollout is over and none trains.
    pub fn policy_may_train(&self) -> bool {
        self.ranks.iter().all(|s| *s == RankState::Completed)
    }

    /// Ranks whose engine still generates.
    pub fn generating(&self) -> usize {
        self.count(|s| s == RankState::Generating)
    }

    fn count(&self, f: impl Fn(RankState) -> bool) -> usize {
        self.ranks.iter().filter(|s| f(**s)).count()
    }

    /// Applies `op` to `rank` if legal; otherwise nothing changes.
    pub fn apply(&mut self, rank: usize, op: BubbleOp) -> Result<RankState, BubbleError> {
        let refuse = |state: Option<RankState>, why: &str| BubbleError {
            op,
            rank: Some(rank),
            state,
            why: why.to_string(),
        };
        let Some(&now) = self.ranks.get(rank) else {
            let why = format!("there are {} ranks", self.ranks.len());
            return Err(refuse(None, &why));
        };
        use RankState::*;
        let next = match (op, now) {
            (BubbleOp::Start, Idle) => Generating,
            (BubbleOp::Finish, Generating) => Released,
            (BubbleOp::Train, Released) => {
                if self.syncing {
                    return Err(refuse(Some(now), "a drafter sync is under way"));
                }
                let ready = self.count(|s| matches!(s, Released | Training));
                if ready < self.min_ranks_for_training {
                    let why = format!(
                        "{ready} ranks released, training needs {}",
                        self.min_ranks_for_training
                    );
                    return Err(refuse(Some(now), &why));
                }
                Training
            }
            (BubbleOp::StopTraining, Training) => Released,
            (BubbleOp::Complete, Released | Training) => {
                if self.generating() > 0 {
                    return Err(refuse(Some(now), "other ranks still generate"));
                }
                Completed
            }
            (BubbleOp::Reset, Completed) => Idle,
            (BubbleOp::BeginSync | BubbleOp::EndSync, _) => {
                return Err(refuse(Some(now), "the drafter sync names no rank"));
            }
            (_, _) => {
                let why = match op {
                    BubbleOp::Start => "only an idle rank starts",
                    BubbleOp::Finish => "only a generating rank finishes",
                    BubbleOp::Train => "only a released rank trains (its engine is done)",
                    BubbleOp::StopTraining => "only a training rank stops",
                    BubbleOp::Complete => "only a released or training rank completes",
                    _ => "only a completed rank resets",
                };
                return Err(refuse(Some(now), why));
            }
        };
        self.ranks[rank] = next;
        Ok(next)
    }

    /// Starts the drafter sync: refused while a rank trains or a sync is under way.
    pub fn begin_sync(&mut self) -> Result<(), BubbleError> {
        let refuse = |why: String| BubbleError {
            op: BubbleOp::BeginSync,
            rank: None,
            state: None,
            why,
        };
        if self.syncing {
            return Err(refuse("a drafter sync is already under way".into()));
        }
        let training = self.count(|s| s == RankState::Training);
        if training > 0 {
            return Err(refuse(format!("{training} ranks train the drafter")));
        }
        self.syncing = true;
        Ok(())
    }

    /// Ends the drafter sync.
    pub fn end_sync(&mut self) -> Result<(), BubbleError> {
        if !self.syncing {
            return Err(BubbleError {
                op: BubbleOp::EndSync,
                rank: None,
                state: None,
                why: "no drafter sync is under way".into(),
            });
        }
        self.syncing = false;
        Ok(())
    }
}
