//! Tests of the engine state machine: the RL loop's cycle, named illegal transitions, and
//! property tests over random operation sequences against an independent reference model.

#![allow(clippy::unwrap_used)] // tests may unwrap

use super::*;
use proptest::prelude::*;

fn tags(t: &[&str]) -> Tags {
    t.iter().map(|s| s.to_string()).collect()
}

#[test]
fn drained_offload_and_staged_onload_cycle() {
    let mut m = EngineMachine::new(0);
    assert!(m.can_generate());
    m.pause().unwrap();
    m.flush().unwrap();
    m.release(&["weights", "kv_cache"]).unwrap();
    assert_eq!(
        m.state(),
        &EngineState::Released(tags(&["kv_cache", "weights"]))
    );
    m.resume(&["weights"]).unwrap();
    m.begin_update(1).unwrap();
    assert!(!m.can_generate());
    m.end_update().unwrap();
    assert_eq!(m.version(), 1);
    assert_eq!(m.state(), &EngineState::Released(tags(&["kv_cache"])));
    m.resume(&["kv_cache"]).unwrap();
    assert_eq!(m.state(), &EngineState::Paused);
    m.continue_generation().unwrap();
    assert!(m.can_generate());
}

#[test]
fn illegal_transitions_name_state_and_operation() {
    let mut m = EngineMachine::new(3);
    let e = m.flush().unwrap_err();
    assert_eq!(
        e.to_string(),
        "illegal engine transition: `flush` in state Serving: the engine is serving; pause it first"
    );
    m.pause().unwrap();
    m.release(&["kv_cache"]).unwrap();
    let e = m.continue_generation().unwrap_err();
    assert!(
        e.to_string()
            .contains("`continue` in state Released(kv_cache)"),
        "{e}"
    );
    assert!(e.to_string().contains("kv_cache still released"), "{e}");
    let e = m.flush().unwrap_err();
    assert!(
        e.to_string().contains("flush only right after pause"),
        "{e}"
    );
    let e = m.release(&["kv_cache"]).unwrap_err();
    assert!(e.to_string().contains("kv_cache already released"), "{e}");
    let e = m.resume(&["weights"]).unwrap_err();
    assert!(e.to_string().contains("weights not released"), "{e}");
    let e = m.begin_update(2).unwrap_err();
    assert!(
        e.to_string()
            .contains("`begin_update(v2)` in state Released(kv_cache)"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("version 2 is below the served version 3"),
        "{e}"
    );
    m.release(&["weights"]).unwrap();
    let e = m.begin_update(4).unwrap_err();
    assert!(
        e.to_string().contains("resume them before an update"),
        "{e}"
    );
    let e = m.resume(&[] as &[&str]).unwrap_err();
    assert!(e.to_string().contains("tag list is empty"), "{e}");
    // Rejections changed nothing.
    assert_eq!(
        m.state(),
        &EngineState::Released(tags(&["kv_cache", "weights"]))
    );
    assert_eq!(m.version(), 3);
}

#[test]
fn aborted_update_keeps_the_version() {
    let mut m = EngineMachine::new(2);
    m.pause().unwrap();
    m.begin_update(5).unwrap();
    assert_eq!(m.state().to_string(), "Updating(v5)");
    let e = m.continue_generation().unwrap_err();
    assert!(e.to_string().contains("update is in progress"), "{e}");
    m.abort_update().unwrap();
    assert_eq!((m.state(), m.version()), (&EngineState::Paused, 2));
}

/// The reference model: plain flags with each operation's precondition written out.
#[derive(Debug, Clone, PartialEq, Default)]
struct Model {
    serving: bool,
    flushed: bool,
    released: Tags,
    updating: Option<u64>,
    version: u64,
}

impl Model {
    fn step(&self, op: &EngineOp) -> Option<Model> {
        let mut n = self.clone();
        let idle = !self.serving && self.updating.is_none();
        match op {
            EngineOp::Pause if self.serving => n.serving = false,
            EngineOp::Flush if idle && !self.flushed && self.released.is_empty() => {
                n.flushed = true
            }
            EngineOp::Release(t) if idle && !t.is_empty() && t.is_disjoint(&self.released) => {
                n.released.extend(t.iter().cloned());
                n.flushed = false;
            }
            EngineOp::Resume(t) if idle && !t.is_empty() && t.is_subset(&self.released) => {
                n.released.retain(|x| !t.contains(x));
            }
            EngineOp::BeginUpdate(v)
                if idle && *v >= self.version && !self.released.contains("weights") =>
            {
                n.updating = Some(*v);
                n.flushed = false;
            }
            EngineOp::EndUpdate if self.updating.is_some() => {
                n.version = self.updating?;
                n.updating = None;
            }
            EngineOp::AbortUpdate if self.updating.is_some() => n.updating = None,
            EngineOp::Continue if idle && self.released.is_empty() => {
                n.serving = true;
                n.flushed = false;
            }
            _ => return None,
        }
        Some(n)
    }

    fn state(&self) -> EngineState {
        match (
            self.serving,
            self.updating,
            self.released.is_empty(),
            self.flushed,
        ) {
            (true, ..) => EngineState::Serving,
            (_, Some(version), ..) => EngineState::Updating {
                version,
                released: self.released.clone(),
            },
            (_, None, false, _) => EngineState::Released(self.released.clone()),
            (_, None, true, true) => EngineState::Flushed,
            (_, None, true, false) => EngineState::Paused,
        }
    }
}

fn tag_set() -> impl Strategy<Value = Tags> {
    proptest::sample::subsequence(vec!["weights", "kv_cache", "drafter"], 0..=3)
        .prop_map(|v| v.into_iter().map(String::from).collect())
}

fn op() -> impl Strategy<Value = EngineOp> {
    prop_oneof![
        3 => Just(EngineOp::Pause),
        2 => Just(EngineOp::Flush),
        3 => tag_set().prop_map(EngineOp::Release),
        3 => tag_set().prop_map(EngineOp::Resume),
        2 => (0u64..6).prop_map(EngineOp::BeginUpdate),
        2 => Just(EngineOp::EndUpdate),
        1 => Just(EngineOp::AbortUpdate),
        3 => Just(EngineOp::Continue),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn machine_agrees_with_the_reference_model(ops in proptest::collection::vec(op(), 0..60)) {
        let mut m = EngineMachine::new(0);
        let mut model = Model { serving: true, ..Model::default() };
        for op in ops {
            let before = m.clone();
            match (m.apply(op.clone()), model.step(&op)) {
                (Ok(_), Some(next)) => model = next,
                (Err(e), None) => {
                    prop_assert_eq!(&m, &before, "a rejected op changed the machine");
                    let names_both = format!("`{op}` in state {}", before.state());
                    let text = e.to_string();
                    prop_assert!(text.contains(&names_both), "{}", text);
                }
                (got, want) => prop_assert!(
                    false,
                    "{} from {}: machine {:?}, model {:?}",
                    op,
                    before.state(),
                    got,
                    want
                ),
            }
            prop_assert_eq!(m.state(), &model.state());
            prop_assert_eq!(m.version(), model.version);
        }
    }

    #[test]
    fn ordering_invariants_hold_on_every_accepted_sequence(ops in proptest::collection::vec(op(), 0..60)) {
        let mut m = EngineMachine::new(0);
        let mut paused_since_continue = false;
        // Released tags as the accepted release/resume calls add up, kept outside the machine.
        let mut outstanding = Tags::new();
        for op in ops {
            let version = m.version();
            let released_before = m.released();
            let accepted = m.apply(op.clone()).is_ok();
            match (&op, accepted) {
                (EngineOp::Release(t), true) => outstanding.extend(t.iter().cloned()),
                (EngineOp::Resume(t), true) => outstanding.retain(|x| !t.contains(x)),
                _ => {}
            }
            // Never serving with memory released.
            prop_assert!(!m.can_generate() || outstanding.is_empty(), "serving with {:?}", outstanding);
            prop_assert_eq!(m.released(), outstanding.clone());
            // Versions only go up, and only when an update ends.
            prop_assert!(m.version() >= version);
            prop_assert!(m.version() == version || (accepted && op == EngineOp::EndUpdate));
            // Weights are resident during an update.
            if let EngineState::Updating { released, .. } = m.state() {
                prop_assert!(!released.contains("weights"));
            }
            if !accepted {
                continue;
            }
            match op {
                EngineOp::Pause => paused_since_continue = true,
                EngineOp::Continue => paused_since_continue = false,
                EngineOp::Release(_) => prop_assert!(paused_since_continue, "release without a pause"),
                EngineOp::Flush => prop_assert!(released_before.is_empty(), "flush while released"),
                _ => {}
            }
        }
    }
}
