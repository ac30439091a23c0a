//! Random interleavings of everything a run does to the ledger — start, complete, fail,
//! expire, admit and train (or hand back), sync the engines, checkpoint (durable), save the
//! ledger alone, crash and restore — checked after every operation against the ledger's
//! invariants, then run to completion: every item ends acknowledged once or dropped, and with
//! retries enough, every item is acknowledged exactly once, crashes or not.

#![allow(clippy::unwrap_used)] // tests may unwrap

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

const PROMPTS: u64 = 5;
const GROUP: u32 = 2;
const DEADLINE: u64 = 6;

/// The dataset's items, in the order a run takes them.
fn dataset() -> Vec<Item> {
    (0..PROMPTS)
        .flat_map(|prompt| (0..GROUP).map(move |sample| Item { prompt, sample }))
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Start the next new item of the dataset.
    Start,
    /// Start the oldest pending item.
    StartPending,
    /// Try to start the n-th item of the dataset, whatever its status.
    StartAny(usize),
    /// Complete the n-th trajectory in flight (by id order, modulo their count).
    Complete(usize),
    /// Fail the n-th trajectory in flight.
    Fail(usize),
    /// Advance the clock and expire.
    Tick(u64),
    /// Admit up to n and train them (the next version).
    Train(usize),
    /// Admit up to n, then hand them back: the step failed.
    TrainFails(usize),
    /// The engines take the trainer's version.
    Sync,
    /// Save a checkpoint at the last trained step (snapshot before or after `durable`).
    Checkpoint(bool),
    /// Save the ledger alone (newer than the checkpoint: steps trained since are not durable).
    SaveLedger,
    /// The controller dies: resume from the last saved ledger and the last durable checkpoint.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Start),
        2 => Just(Op::StartPending),
        1 => (0usize..10).prop_map(Op::StartAny),
        4 => (0usize..8).prop_map(Op::Complete),
        1 => (0usize..8).prop_map(Op::Fail),
        1 => (1u64..4).prop_map(Op::Tick),
        2 => (1usize..5).prop_map(Op::Train),
        1 => (1usize..5).prop_map(Op::TrainFails),
        2 => Just(Op::Sync),
        2 => any::<bool>().prop_map(Op::Checkpoint),
        1 => Just(Op::SaveLedger),
        1 => Just(Op::Crash),
    ]
}

/// The run around the ledger: the trainer's version, the engines', the dataset position, the
/// clock, the step of the last durable checkpoint, the last saved ledger (with the dataset
/// position beside it), and every item acknowledged by a `durable` call.
struct Run {
    ledger: Ledger,
    k: u64,
    version: u64,
    engine_version: u64,
    cursor: usize,
    tick: u64,
    last_trained: Option<u64>,
    durable: Option<u64>,
    saved: Option<(LedgerState, usize)>,
    acked: BTreeSet<Item>,
}

impl Run {
    fn new(config: LedgerConfig, k: u64) -> Self {
        Run {
            ledger: Ledger::new(config),
            k,
            version: 0,
            engine_version: 0,
            cursor: 0,
            tick: 0,
            last_trained: None,
            durable: None,
            saved: None,
            acked: BTreeSet::new(),
        }
    }

    fn started(&self) -> Vec<TrajectoryId> {
        let l = &self.ledger;
        l.trajectories()
            .filter(|t| t.state == State::Started)
            .map(|t| t.id)
            .collect()
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        let items = dataset();
        match op {
            Op::Start => {
                // Items started out of order (`StartAny`) are skipped.
                while let Some(item) = items.get(self.cursor) {
                    self.cursor += 1;
                    if self.ledger.item(*item).is_none() {
                        self.ledger
                            .start(*item, self.engine_version, self.tick)
                            .unwrap();
                        break;
                    }
                }
            }
            Op::StartAny(n) => {
                let item = items[n % items.len()];
                let status = self.ledger.item(item).map(|e| e.status);
                let may = matches!(status, None | Some(ItemStatus::Pending { .. }));
                let got = self.ledger.start(item, self.engine_version, self.tick);
                prop_assert_eq!(
                    got.is_ok(),
                    may,
                    "{} in status {:?}: {:?}",
                    item,
                    status,
                    got
                );
            }
            Op::StartPending => {
                let before = self.ledger.pending().next().copied();
                let got = self.ledger.start_pending(self.engine_version, self.tick);
                prop_assert_eq!(got.map(|(_, i)| i), before);
            }
            Op::Complete(n) => {
                let started = self.started();
                if !started.is_empty() {
                    let id = started[n % started.len()];
                    let start = self.ledger.trajectory(id).unwrap().start_version;
                    let completion = Completion {
                        tokens: 3,
                        oldest_version: start,
                        newest_version: self.engine_version,
                    };
                    self.ledger.complete(id, completion).unwrap();
                }
            }
            Op::Fail(n) => {
                let started = self.started();
                if !started.is_empty() {
                    self.ledger
                        .fail(started[n % started.len()], "worker died")
                        .unwrap();
                }
            }
            Op::Tick(d) => {
                self.tick += d;
                self.ledger.expire(self.tick);
                for t in self
                    .ledger
                    .trajectories()
                    .filter(|t| t.state == State::Started)
                {
                    prop_assert!(self.tick - t.started_at < DEADLINE, "{:?} outlived", t);
                }
            }
            Op::Train(max) => self.train(max)?,
            Op::TrainFails(max) => {
                let adm = self.admit(max)?;
                for a in adm {
                    self.ledger.release(a.id).unwrap();
                }
            }
            Op::Sync => self.engine_version = self.version,
            Op::Checkpoint(before) => self.checkpoint(before)?,
            Op::SaveLedger => self.saved = Some((self.ledger.snapshot(), self.cursor)),
            Op::Crash => self.crash()?,
        }
        Ok(())
    }

    /// Admits a batch for the current version, checking the bound.
    fn admit(&mut self, max: usize) -> Result<Vec<Admitted>, TestCaseError> {
        let adm = self.ledger.admit(self.version, self.k, max);
        prop_assert!(adm.admitted.len() <= max);
        for a in &adm.admitted {
            prop_assert!(
                a.completion.oldest_version + self.k >= self.version,
                "{:?}",
                a
            );
            prop_assert_eq!(a.staleness, self.version - a.completion.oldest_version);
        }
        for s in &adm.stale {
            prop_assert!(s.staleness > self.k);
        }
        Ok(adm.admitted)
    }

    fn train(&mut self, max: usize) -> Result<(), TestCaseError> {
        let adm = self.admit(max)?;
        if !adm.is_empty() {
            let ids: Vec<_> = adm.iter().map(|a| a.id).collect();
            self.ledger.trained(self.version, &ids).unwrap();
            self.last_trained = Some(self.version);
            self.version += 1;
        }
        Ok(())
    }

    fn checkpoint(&mut self, snapshot_first: bool) -> Result<(), TestCaseError> {
        let Some(step) = self.last_trained else {
            return Ok(());
        };
        let snapshot = snapshot_first.then(|| self.ledger.snapshot());
        for id in self.ledger.durable(step) {
            let item = self.ledger.trajectory(id).unwrap().item;
            prop_assert!(self.acked.insert(item), "{} acknowledged twice", item);
        }
        let snapshot = snapshot.unwrap_or_else(|| self.ledger.snapshot());
        self.durable = Some(step);
        self.saved = Some((snapshot, self.cursor));
        Ok(())
    }

    fn crash(&mut self) -> Result<(), TestCaseError> {
        let config = self.ledger.config();
        match self.saved.clone() {
            None => {
                prop_assert!(self.acked.is_empty());
                self.ledger = Ledger::new(config);
                (self.version, self.cursor, self.last_trained) = (0, 0, None);
            }
            Some((state, cursor)) => {
                let json = serde_json::to_string(&state).unwrap();
                let state: LedgerState = serde_json::from_str(&json).unwrap();
                let (ledger, regen) = Ledger::restore(state, self.durable).unwrap();
                prop_assert_eq!(regen, ledger.pending().copied().collect::<Vec<_>>());
                self.ledger = ledger;
                let version = self.durable.map_or(0, |s| s + 1);
                (self.version, self.cursor, self.last_trained) = (version, cursor, self.durable);
            }
        }
        self.engine_version = self.version;
        prop_assert_eq!(self.ledger.counters().in_flight, 0);
        prop_assert_eq!(
            &acknowledged(&self.ledger),
            &self.acked,
            "durable acks survive"
        );
        Ok(())
    }

    /// Runs on to the end without failures: everything started, completed on the current
    /// weights, trained and made durable.
    fn finish(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..8 {
            while self.cursor < dataset().len() {
                self.apply(Op::Start)?;
            }
            while self
                .ledger
                .start_pending(self.engine_version, self.tick)
                .is_some()
            {}
            self.engine_version = self.version;
            for id in self.started() {
                let start = self.ledger.trajectory(id).unwrap().start_version;
                let completion = Completion {
                    tokens: 3,
                    oldest_version: start,
                    newest_version: self.engine_version,
                };
                self.ledger.complete(id, completion).unwrap();
            }
            self.train(usize::MAX)?;
            self.checkpoint(false)?;
            check(&self.ledger)?;
            let c = self.ledger.counters();
            if c.in_flight == 0 && c.pending == 0 {
                return Ok(());
            }
        }
        prop_assert!(
            false,
            "the run did not finish: {:?}",
            self.ledger.counters()
        );
        Ok(())
    }
}

fn acknowledged(l: &Ledger) -> BTreeSet<Item> {
    l.items()
        .filter(|(_, e)| matches!(e.status, ItemStatus::Acknowledged(_)))
        .map(|(i, _)| *i)
        .collect()
}

/// The invariants that hold after every operation.
fn check(l: &Ledger) -> Result<(), TestCaseError> {
    let c = l.counters();
    let count =
        |f: &dyn Fn(&State) -> bool| l.trajectories().filter(|t| f(&t.state)).count() as u64;
    prop_assert_eq!(c.started, l.trajectories().count() as u64);
    prop_assert_eq!(c.in_flight, count(&|s| !s.is_terminal()));
    prop_assert_eq!(
        c.acknowledged,
        count(&|s| matches!(s, State::Acknowledged { .. }))
    );
    prop_assert_eq!(c.failed, count(&|s| matches!(s, State::Failed(_))));
    let stale = |s: &State| matches!(s, State::Dropped(DropReason::Stale { .. }));
    prop_assert_eq!(c.dropped_stale, count(&stale));
    let exhausted = |s: &State| matches!(s, State::Dropped(DropReason::RetriesExhausted { .. }));
    prop_assert_eq!(c.dropped_failed, count(&exhausted));
    prop_assert_eq!(
        c.started,
        c.acknowledged + c.failed + c.dropped_failed + c.dropped_stale + c.in_flight
    );
    prop_assert_eq!(c.pending, l.pending().count() as u64);
    // At most one trajectory per item in flight, and it is the one its item names.
    let mut live = BTreeSet::new();
    for t in l.trajectories().filter(|t| !t.state.is_terminal()) {
        prop_assert!(
            live.insert(t.item),
            "{} has two trajectories in flight",
            t.item
        );
        prop_assert_eq!(l.item(t.item).unwrap().status, ItemStatus::Live(t.id));
    }
    // An item is acknowledged by exactly one trajectory, and it is that item's.
    for (item, e) in l.items() {
        let acks = l
            .trajectories()
            .filter(|t| t.item == *item && matches!(t.state, State::Acknowledged { .. }))
            .count();
        let expected = usize::from(matches!(e.status, ItemStatus::Acknowledged(_)));
        prop_assert_eq!(acks, expected, "{} acknowledged {} times", item, acks);
    }
    // Retries link back to an earlier trajectory of the same item.
    for t in l.trajectories() {
        if let Some(prev) = t.retry_of {
            prop_assert!(prev < t.id);
            prop_assert_eq!(l.trajectory(prev).unwrap().item, t.item);
        }
    }
    Ok(())
}

fn run(config: LedgerConfig, k: u64, ops: Vec<Op>) -> Result<Run, TestCaseError> {
    let mut r = Run::new(config, k);
    for op in ops {
        r.apply(op)?;
        check(&r.ledger)?;
    }
    r.finish()?;
    let l = &r.ledger;
    prop_assert_eq!(&acknowledged(l), &r.acked);
    let all: BTreeSet<Item> = dataset().into_iter().collect();
    let dropped: BTreeSet<Item> = l
        .items()
        .filter(|(_, e)| matches!(e.status, ItemStatus::Dropped(_)))
        .map(|(i, _)| *i)
        .collect();
    prop_assert!(r.acked.is_disjoint(&dropped));
    prop_assert_eq!(
        &r.acked | &dropped,
        all,
        "every item ends acknowledged or dropped"
    );
    Ok(r)
}

fn config() -> impl Strategy<Value = LedgerConfig> {
    let policy = prop_oneof![Just(StalePolicy::Regenerate), Just(StalePolicy::Drop)];
    (0u32..3, policy).prop_map(|(retry_budget, stale_policy)| LedgerConfig {
        retry_budget,
        stale_policy,
        deadline: DEADLINE,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_trajectory_ends_once_and_no_item_is_trained_twice(
        config in config(),
        k in 0u64..3,
        ops in proptest::collection::vec(op(), 0..100),
    ) {
        run(config, k, ops)?;
    }

    #[test]
    fn with_retries_enough_crashes_train_every_item_exactly_once(
        k in 0u64..3,
        ops in proptest::collection::vec(op(), 0..100),
    ) {
        let config = LedgerConfig {
            retry_budget: u32::MAX,
            stale_policy: StalePolicy::Regenerate,
            deadline: DEADLINE,
        };
        let r = run(config, k, ops)?;
        prop_assert_eq!(r.acked, dataset().into_iter().collect::<BTreeSet<_>>());
    }
}
