//! The coordinator's rules: examples, then random operation sequences checked against the
//! invariants of the bubble schedule, and the closing protocol reaching the train phase
//! from anywhere.

#![allow(clippy::unwrap_used)] // tests may unwrap

use super::*;
use RankState::*;
use proptest::prelude::*;
use std::time::{Duration, Instant};

#[test]
fn a_step_runs_through_every_state() {
    let mut c = Coordinator::new(2, 1);
    for r in 0..2 {
        assert_eq!(c.apply(r, BubbleOp::Start), Ok(Generating));
    }
    assert_eq!(c.apply(1, BubbleOp::Finish), Ok(Released));
    // Rank 1 trains while rank 0 still generates: the bubble.
    assert_eq!(c.apply(1, BubbleOp::Train), Ok(Training));
    let e = c.apply(1, BubbleOp::Complete).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bubble coordinator: `complete` of rank 1 in state training refused: other ranks still \
         generate"
    );
    assert!(!c.policy_may_train());
    assert_eq!(c.apply(0, BubbleOp::Finish), Ok(Released));
    assert_eq!(c.apply(1, BubbleOp::Complete), Ok(Completed));
    assert!(!c.policy_may_train(), "rank 0 is not completed");
    assert_eq!(c.apply(0, BubbleOp::Complete), Ok(Completed));
    assert!(c.policy_may_train());
    c.begin_sync().unwrap();
    c.end_sync().unwrap();
    for r in 0..2 {
        assert_eq!(c.apply(r, BubbleOp::Reset), Ok(Idle));
    }
}

#[test]
fn a_generating_rank_never_trains_and_a_sync_excludes_training() {
    let mut c = Coordinator::new(2, 1);
    c.apply(0, BubbleOp::Start).unwrap();
    let e = c.apply(0, BubbleOp::Train).unwrap_err();
    assert_eq!(e.state, Some(Generating));
    assert!(e.to_string().contains("its engine is done"), "{e}");
    c.apply(0, BubbleOp::Finish).unwrap();
    c.begin_sync().unwrap();
    let e = c.apply(0, BubbleOp::Train).unwrap_err();
    assert!(e.to_string().contains("drafter sync is under way"), "{e}");
    c.end_sync().unwrap();
    c.apply(0, BubbleOp::Train).unwrap();
    let e = c.begin_sync().unwrap_err();
    assert_eq!(
        e.to_string(),
        "bubble coordinator: `begin_sync` refused: 1 ranks train the drafter"
    );
}

#[test]
fn training_waits_for_enough_released_ranks() {
    let mut c = Coordinator::new(3, 2);
    for r in 0..3 {
        c.apply(r, BubbleOp::Start).unwrap();
    }
    c.apply(2, BubbleOp::Finish).unwrap();
    let e = c.apply(2, BubbleOp::Train).unwrap_err();
    assert!(
        e.to_string().contains("1 ranks released, training needs 2"),
        "{e}"
    );
    c.apply(0, BubbleOp::Finish).unwrap();
    c.apply(2, BubbleOp::Train).unwrap();
    c.apply(0, BubbleOp::Train).unwrap();
    let e = c.apply(7, BubbleOp::Start).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bubble coordinator: `start` of rank 7 refused: there are 3 ranks"
    );
}

#[test]
fn tail_and_bubble_come_from_the_finish_times() {
    let t0 = Instant::now();
    let mut b = BubbleTimes::new(3);
    b.finished(0, t0 + Duration::from_millis(1000));
    b.finished(1, t0 + Duration::from_millis(400));
    assert_eq!(
        (b.tail_s(), b.bubble_s()),
        (0.0, 0.0),
        "rank 2 not finished"
    );
    b.finished(2, t0 + Duration::from_millis(100));
    assert!((b.tail_s() - 0.9).abs() < 1e-9, "{}", b.tail_s());
    // Ranks 1 and 2 idle 0.6 s and 0.9 s while rank 0 finishes.
    assert!((b.bubble_s() - 1.5).abs() < 1e-9, "{}", b.bubble_s());
}

const RANKS: usize = 3;

fn op() -> impl Strategy<Value = (usize, BubbleOp)> {
    let rank = 0..RANKS + 1;
    let op = prop_oneof![
        Just(BubbleOp::Start),
        Just(BubbleOp::Finish),
        Just(BubbleOp::Train),
        Just(BubbleOp::StopTraining),
        Just(BubbleOp::Complete),
        Just(BubbleOp::Reset),
        Just(BubbleOp::BeginSync),
        Just(BubbleOp::EndSync),
    ];
    (rank, op)
}

fn apply(c: &mut Coordinator, rank: usize, op: BubbleOp) -> Result<(), BubbleError> {
    match op {
        BubbleOp::BeginSync => c.begin_sync(),
        BubbleOp::EndSync => c.end_sync(),
        _ => c.apply(rank, op).map(|_| ()),
    }
}

/// What the driver does at the end of a rollout from any state: every idle rank is started,
/// every generating rank finishes, a drafter sync ends, every rank completes.
fn close(c: &mut Coordinator) {
    for r in 0..RANKS {
        if c.states()[r] == Idle {
            c.apply(r, BubbleOp::Start).unwrap();
        }
    }
    for r in 0..RANKS {
        if c.states()[r] == Generating {
            c.apply(r, BubbleOp::Finish).unwrap();
        }
    }
    if c.syncing() {
        c.end_sync().unwrap();
    }
    for r in 0..RANKS {
        if c.states()[r] != Completed {
            c.apply(r, BubbleOp::Complete).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_sequences_keep_the_schedule(
        ops in proptest::collection::vec(op(), 0..80),
        min_ranks in 1usize..=RANKS,
    ) {
        let mut c = Coordinator::new(RANKS, min_ranks);
        // Whether each rank's engine returned its share since its last reset.
        let mut finished = [false; RANKS];
        for (rank, op) in ops {
            let before = c.clone();
            match apply(&mut c, rank, op) {
                Ok(()) => match op {
                    BubbleOp::Finish => finished[rank] = true,
                    BubbleOp::Reset => finished[rank] = false,
                    BubbleOp::Train => {
                        prop_assert!(!before.syncing(), "trained during a drafter sync");
                        let ready = before
                            .states()
                            .iter()
                            .filter(|s| matches!(s, Released | Training))
                            .count();
                        prop_assert!(ready >= min_ranks, "trained with {} ranks ready", ready);
                    }
                    BubbleOp::Complete => {
                        prop_assert_eq!(before.generating(), 0, "completed during the rollout");
                    }
                    _ => {}
                },
                Err(e) => {
                    prop_assert_eq!(&c, &before, "a refused op changed the coordinator: {}", e);
                }
            }
            for (r, s) in c.states().iter().enumerate() {
                if matches!(s, Released | Training | Completed) {
                    prop_assert!(finished[r], "rank {} is {} before its engine finished", r, s);
                }
            }
            let training = c.states().contains(&Training);
            prop_assert!(!(training && c.syncing()), "the drafter trains and syncs at once");
            if c.policy_may_train() {
                prop_assert!(c.states().iter().all(|s| *s == Completed));
                prop_assert_eq!(c.generating(), 0);
            }
        }
        // From wherever the sequence left it, the end of the rollout reaches the train phase.
        close(&mut c);
        prop_assert!(c.policy_may_train(), "{:?}", c.states());
    }
}
