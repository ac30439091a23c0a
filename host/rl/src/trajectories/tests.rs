//! The ledger's transitions one by one: each legal one with its counters, each refused one
//! with its message and no change.

#![allow(clippy::unwrap_used)] // tests may unwrap

use super::*;

fn ledger(retry_budget: u32, stale_policy: StalePolicy) -> Ledger {
    Ledger::new(LedgerConfig {
        retry_budget,
        stale_policy,
        deadline: 10,
    })
}

fn item(prompt: u64, sample: u32) -> Item {
    Item { prompt, sample }
}

fn done(oldest_version: u64, newest_version: u64) -> Completion {
    Completion {
        tokens: 5,
        oldest_version,
        newest_version,
    }
}

#[test]
fn a_trajectory_runs_from_start_to_acknowledged() {
    let mut l = ledger(1, StalePolicy::Drop);
    let a = l.start(item(7, 0), 3, 0).unwrap();
    let b = l.start(item(7, 1), 3, 0).unwrap();
    assert!(b > a, "ids increase");
    l.complete(a, done(3, 4)).unwrap();
    let adm = l.admit(4, 1, 8);
    assert_eq!(adm.admitted.len(), 1);
    assert_eq!((adm.admitted[0].id, adm.admitted[0].staleness), (a, 1));
    l.trained(4, &[a]).unwrap();
    assert_eq!(l.trajectory(a).unwrap().state.name(), "trained");
    assert_eq!(l.durable(3), vec![], "step 4 is not durable yet");
    assert_eq!(l.durable(4), vec![a]);
    assert_eq!(
        l.item(item(7, 0)).unwrap().status,
        ItemStatus::Acknowledged(a)
    );
    let c = l.counters();
    assert_eq!(
        (
            c.started,
            c.completed,
            c.admitted,
            c.trained,
            c.acknowledged,
            c.in_flight
        ),
        (2, 1, 1, 1, 1, 1)
    );
    assert_eq!(l.staleness_histogram().get(&1), Some(&1));
    let e = l.start(item(7, 0), 5, 0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trajectory ledger: `start` of prompt 7 sample 0 refused: it is acknowledged (an item \
         runs once at a time and never again once acknowledged or dropped)"
    );
}

#[test]
fn a_failure_is_retried_under_a_new_id_then_dropped_when_the_budget_is_spent() {
    let mut l = ledger(1, StalePolicy::Drop);
    let it = item(1, 0);
    let a = l.start(it, 0, 0).unwrap();
    assert_eq!(l.fail(a, "engine 0 died").unwrap(), FailOutcome::Retry(it));
    assert_eq!(
        l.trajectory(a).unwrap().state,
        State::Failed(FailReason::Error("engine 0 died".into()))
    );
    assert_eq!(l.pending().copied().collect::<Vec<_>>(), vec![it]);
    let (b, again) = l.start_pending(0, 1).unwrap();
    assert_eq!(again, it);
    assert_eq!(l.trajectory(b).unwrap().retry_of, Some(a));
    assert_eq!(
        l.fail(b, "environment worker died").unwrap(),
        FailOutcome::Dropped(it)
    );
    assert!(matches!(
        l.trajectory(b).unwrap().state,
        State::Dropped(DropReason::RetriesExhausted { attempts: 2, .. })
    ));
    assert_eq!(l.item(it).unwrap().status, ItemStatus::Dropped(b));
    assert!(l.start_pending(0, 2).is_none());
    let c = l.counters();
    assert_eq!(
        (
            c.started,
            c.failed,
            c.retried,
            c.dropped_failed,
            c.items_dropped,
            c.in_flight,
            c.pending
        ),
        (2, 1, 1, 1, 1, 0, 0)
    );
    assert!(
        l.start(it, 0, 3).is_err(),
        "a dropped item never runs again"
    );
}

#[test]
fn expire_fails_only_what_is_in_flight_past_the_deadline() {
    let mut l = ledger(3, StalePolicy::Drop);
    let old = l.start(item(1, 0), 0, 0).unwrap();
    let young = l.start(item(2, 0), 0, 5).unwrap();
    let finished = l.start(item(3, 0), 0, 0).unwrap();
    l.complete(finished, done(0, 0)).unwrap();
    let out = l.expire(12);
    assert_eq!(out, vec![(old, FailOutcome::Retry(item(1, 0)))]);
    assert_eq!(
        l.trajectory(old).unwrap().state,
        State::Failed(FailReason::Expired { age: 12 })
    );
    assert_eq!(l.trajectory(young).unwrap().state, State::Started);
    assert_eq!(l.expire(15), vec![(young, FailOutcome::Retry(item(2, 0)))]);
}

#[test]
fn admission_keeps_the_bound_and_drops_or_regenerates_the_stale() {
    for policy in [StalePolicy::Drop, StalePolicy::Regenerate] {
        let mut l = ledger(1, policy);
        let ids: Vec<_> = (0..4u64)
            .map(|v| {
                let id = l.start(item(v, 0), v, 0).unwrap();
                l.complete(id, done(v, v)).unwrap();
                id
            })
            .collect();
        // Training version 3 with k = 1: versions 2 and 3 are in bound, 0 and 1 are not.
        let adm = l.admit(3, 1, 1);
        assert_eq!(
            adm.admitted.iter().map(|a| a.id).collect::<Vec<_>>(),
            vec![ids[2]]
        );
        let stale: Vec<_> = adm.stale.iter().map(|s| (s.id, s.staleness)).collect();
        assert_eq!(stale, vec![(ids[0], 3), (ids[1], 2)]);
        let regenerated = policy == StalePolicy::Regenerate;
        assert!(adm.stale.iter().all(|s| s.regenerated == regenerated));
        assert_eq!(l.pending().count(), if regenerated { 2 } else { 0 });
        assert_eq!(l.counters().dropped_stale, 2);
        // The one left for lack of room is admitted next; k = 0 is synchronous.
        let next = l.admit(3, 0, 8);
        assert_eq!(
            next.admitted.iter().map(|a| a.id).collect::<Vec<_>>(),
            vec![ids[3]]
        );
        assert!(l.admit(3, 0, 8).admitted.is_empty());
    }
}

#[test]
fn refused_calls_name_the_trajectory_and_change_nothing() {
    let mut l = ledger(1, StalePolicy::Drop);
    let a = l.start(item(1, 0), 2, 0).unwrap();
    let before = l.clone();
    let e = l.complete(a, done(1, 3)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trajectory ledger: `complete` of trajectory 0 refused: token versions 1..3 with start \
         version 2 (need start <= oldest <= newest)"
    );
    let e = l.trained(0, &[a]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trajectory ledger: `trained` of trajectory 0 in state started refused: only what \
         `admit` returned, not yet trained, is trained or released"
    );
    let e = l.fail(TrajectoryId(9), "x").unwrap_err();
    assert_eq!(
        e.to_string(),
        "trajectory ledger: no trajectory 9 (ids come from `start`; after a restore, use the \
         restored ledger's ids)"
    );
    assert!(l.start(item(1, 0), 2, 0).is_err(), "already in flight");
    assert_eq!(l, before);
    l.complete(a, done(2, 2)).unwrap();
    let e = l.fail(a, "late").unwrap_err();
    assert!(e.to_string().contains("in state completed refused"), "{e}");
    l.admit(2, 0, 1);
    let e = l.trained(1, &[a, a]).unwrap_err();
    assert_eq!(e, LedgerError::DuplicateInBatch { id: a });
    l.durable(1);
    let e = l.trained(1, &[a]).unwrap_err();
    assert_eq!(
        e,
        LedgerError::StepAlreadyDurable {
            step: 1,
            durable: 1
        }
    );
    l.trained(2, &[a]).unwrap();
}

#[test]
fn a_released_trajectory_is_admitted_again_first_and_rechecked() {
    let mut l = ledger(0, StalePolicy::Drop);
    let a = l.start(item(1, 0), 0, 0).unwrap();
    let b = l.start(item(2, 0), 1, 0).unwrap();
    l.complete(b, done(1, 1)).unwrap();
    l.complete(a, done(0, 0)).unwrap();
    let first = l.admit(1, 1, 1);
    assert_eq!(first.admitted[0].id, b, "completion order");
    l.release(b).unwrap();
    let again = l.admit(1, 1, 1);
    assert_eq!(again.admitted[0].id, b, "released first in line");
    l.release(b).unwrap();
    let later = l.admit(3, 1, 8);
    assert!(later.admitted.is_empty(), "both now too stale");
    assert_eq!(later.stale.len(), 2);
    assert!(l.release(a).is_err());
}

#[test]
fn restore_acknowledges_the_durable_step_and_requeues_everything_else() {
    let mut l = ledger(0, StalePolicy::Drop);
    let items: Vec<Item> = (0..6).map(|p| item(p, 0)).collect();
    let ids: Vec<_> = items.iter().map(|i| l.start(*i, 0, 0).unwrap()).collect();
    for id in &ids[..5] {
        l.complete(*id, done(0, 0)).unwrap();
    }
    // ids 0-1 trained by step 0 (durable), 2 by step 1 (the checkpoint's), 3 admitted,
    // 4 completed, 5 started.
    l.admit(0, 0, 2);
    l.trained(0, &ids[..2]).unwrap();
    l.durable(0);
    l.admit(1, 1, 1);
    l.trained(1, &ids[2..3]).unwrap();
    l.admit(1, 1, 1);
    let saved = serde_json::to_string(&l.snapshot()).unwrap();
    let state: LedgerState = serde_json::from_str(&saved).unwrap();
    assert_eq!(state, l.snapshot());

    // Resumed from step 1's checkpoint: its trajectory is acknowledged, the rest re-run.
    let (mut r, regen) = Ledger::restore(state.clone(), Some(1)).unwrap();
    assert_eq!(regen, items[3..].to_vec());
    assert_eq!(
        r.item(items[2]).unwrap().status,
        ItemStatus::Acknowledged(ids[2])
    );
    assert_eq!(
        r.trajectory(ids[4]).unwrap().state,
        State::Failed(FailReason::Lost)
    );
    let c = r.counters();
    assert_eq!(
        (c.acknowledged, c.lost, c.in_flight, c.pending),
        (3, 3, 0, 3)
    );
    let (n, it) = r.start_pending(2, 0).unwrap();
    assert_eq!((n, it), (TrajectoryId(6), items[3]), "ids are never reused");
    assert_eq!(r.trajectory(n).unwrap().retry_of, Some(ids[3]));
    assert!(
        r.start(items[0], 2, 0).is_err(),
        "acknowledged before the crash"
    );

    // Resumed from step 0's checkpoint: step 1 was not durable, so its item re-runs too.
    let (_, regen) = Ledger::restore(state.clone(), Some(0)).unwrap();
    assert_eq!(regen, items[2..].to_vec());
    let e = Ledger::restore(state, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trajectory ledger: the snapshot cannot be restored: it acknowledges step 0, after the \
         resumed checkpoint's step (none) (restore the snapshot saved with that checkpoint)"
    );
}

#[test]
fn restore_refuses_a_state_that_does_not_hold_together() {
    let mut l = ledger(0, StalePolicy::Drop);
    let a = l.start(item(1, 0), 0, 0).unwrap();
    let mut s = l.snapshot();
    s.next_id = 0;
    let e = Ledger::restore(s, None).unwrap_err();
    assert!(
        e.to_string()
            .contains("trajectory 0 is not below the next id 0"),
        "{e}"
    );
    let mut s = l.snapshot();
    s.items.clear();
    let e = Ledger::restore(s, None).unwrap_err();
    assert!(e.to_string().contains("trajectory 0 is started but"), "{e}");
    let mut s = l.snapshot();
    s.pending.push(item(1, 0));
    assert!(Ledger::restore(s, None).is_err());
    let mut s = l.snapshot();
    s.counters.in_flight = 0;
    assert!(Ledger::restore(s, None).is_err());
    let (r, regen) = Ledger::restore(l.snapshot(), None).unwrap();
    assert_eq!(regen, vec![item(1, 0)]);
    assert_eq!(
        r.trajectory(a).unwrap().state,
        State::Failed(FailReason::Lost)
    );
}
