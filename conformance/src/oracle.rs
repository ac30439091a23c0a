//! Random lifecycle sequences against the state machine: every operation the machine allows
//! must succeed on the engine, every operation it forbids must be refused, and the engine's
//! reported version must be the machine's.
//!
//! Sequences are drawn from the declared capabilities only (declared pause modes, releasable
//! tags, checkpoint-dir updates of the served model's own directory). The runner is seeded
//! (deterministic) and does not shrink: after a mismatch the engine's real state is unknown,
//! so the first failing sequence is reported as it ran.

use crate::engine::EngineHarness;
use crate::expect::one;
use crate::harness::{Failure, Outcome};
use proptest::prelude::any;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::cell::RefCell;
use tandem_plugin_api::lifecycle::{EngineOp, Tags};
use tandem_plugin_api::{PauseMode, RResult};

/// A candidate operation (the update's version is relative to the served one).
#[derive(Debug, Clone)]
enum Cand {
    Pause(PauseMode),
    Op(EngineOp),
    Update(i64),
}

/// Number of sequences (`TANDEM_CONFORMANCE_CASES`, default 32).
fn cases() -> u32 {
    std::env::var("TANDEM_CONFORMANCE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

fn tags_of(mask: u32, declared: &[String]) -> Tags {
    declared
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, t)| t.clone())
        .collect()
}

/// Runs the sequences; the first mismatch is the failure.
pub(crate) fn run(h: &mut EngineHarness) -> Outcome {
    let modes: Vec<PauseMode> = h.decl.caps.pause_modes.to_vec();
    let tags: Vec<String> = h
        .decl
        .caps
        .releasable_tags
        .iter()
        .map(ToString::to_string)
        .collect();
    let updates = h.checkpoint_update(0).is_some();
    let masks = (1u32 << tags.len().min(8)).max(2);
    let mut cands: Vec<Cand> = modes.iter().map(|m| Cand::Pause(*m)).collect();
    if !modes.is_empty() {
        cands.push(Cand::Op(EngineOp::Flush));
        cands.push(Cand::Op(EngineOp::Continue));
        for m in (1..masks).filter(|_| !tags.is_empty()) {
            cands.push(Cand::Op(EngineOp::Release(tags_of(m, &tags))));
            cands.push(Cand::Op(EngineOp::Resume(tags_of(m, &tags))));
        }
        if updates {
            cands.extend([-1, 0, 1].map(Cand::Update));
        }
    }
    // Each draw picks, in the state the engine is in then, a legal operation (three times in
    // four) or any operation: sequences go deep into the machine instead of stopping at the
    // first refusal, and still try every illegal move.
    let strategy = proptest::collection::vec(any::<u16>(), 1..16);
    let config = Config {
        cases: cases(),
        max_shrink_iters: 0,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let cell = RefCell::new(h);
    let result = runner.run(&strategy, |draws| {
        let mut h = cell.borrow_mut();
        h.to_serving()
            .map_err(|f| TestCaseError::fail(f.to_string()))?;
        let mut done: Vec<String> = Vec::new();
        for draw in draws {
            let resolve = |c: &Cand, version: u64| match c {
                Cand::Pause(m) => (EngineOp::Pause, *m),
                Cand::Op(op) => (op.clone(), PauseMode::Wait),
                Cand::Update(d) => (
                    EngineOp::BeginUpdate(version.saturating_add_signed(*d)),
                    PauseMode::Wait,
                ),
            };
            let version = h.machine.version();
            let legal: Vec<&Cand> = cands
                .iter()
                .filter(|c| h.machine.clone().apply(resolve(c, version).0).is_ok())
                .collect();
            let pick = usize::from(draw / 4);
            let chosen = if draw % 4 != 0 && !legal.is_empty() {
                Some(legal[pick % legal.len()])
            } else {
                cands.get(pick % cands.len().max(1))
            };
            // After every operation, generation is probed too: only Serving may generate.
            for op in [chosen.map(|c| resolve(c, version)), None] {
            let (op, mode) = match op {
                Some((op, mode)) => (Some(op), mode),
                None => (None, PauseMode::Wait),
            };
            let (name, legal, got) = match op {
                None => {
                    let legal = h.machine.can_generate();
                    let got = match h.engine.generate(h.greedy()) {
                        RResult::ROk(_) => Ok(()),
                        RResult::RErr(e) => Err(e),
                    };
                    ("generate".to_owned(), legal, got)
                }
                Some(op) => {
                    let name = match &op {
                        EngineOp::Pause => format!("pause({})", mode.as_str()),
                        other => other.to_string(),
                    };
                    let legal = h.machine.clone().apply(op.clone()).is_ok();
                    let got = match h.call(&op, mode) {
                        RResult::ROk(()) => Ok(()),
                        RResult::RErr(e) => Err(e),
                    };
                    if got.is_ok() {
                        h.advance(op);
                    }
                    (name, legal, got)
                }
            };
            let before = done.join(" → ");
            done.push(name.clone());
            match (legal, got) {
                (true, Err(e)) => {
                    return Err(TestCaseError::fail(format!(
                        "after [{before}] the state machine allows `{name}` (state {}), but the \
                         engine refused it: {}",
                        h.machine.state(),
                        one(&e)
                    )));
                }
                (false, Ok(())) => {
                    return Err(TestCaseError::fail(format!(
                        "after [{before}] the state machine forbids `{name}` in state {}, but \
                         the engine accepted it",
                        h.machine.state()
                    )));
                }
                _ => {}
            }
            let served = match h.engine.health() {
                RResult::ROk(health) => health.weight_version,
                RResult::RErr(e) => return Err(TestCaseError::fail(one(&e))),
            };
            if served != h.machine.version() {
                return Err(TestCaseError::fail(format!(
                    "after [{}] the engine serves version {served}, the state machine says {}",
                    done.join(" → "),
                    h.machine.version()
                )));
            }
        }
        }
        Ok(())
    });
    result.map_err(|e| {
        let text = match e {
            proptest::test_runner::TestError::Fail(why, _) => why.to_string(),
            other => other.to_string(),
        };
        Failure::new("lifecycle follows the engine state machine", text)
    })
}
