//! Running a check: the shared component cell, failures that name the rule, and the runners
//! the suite macros call.

use crate::engine::EngineHarness;
use crate::setup::{BridgeSetup, EngineSetup, TrainerSetup};
use crate::trainer::TrainerHarness;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A broken rule of the contract.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The rule, as the suite names it (e.g. `no generation while paused`).
    pub rule: &'static str,
    /// What happened.
    pub detail: String,
}

impl Failure {
    /// A failure of `rule`.
    pub fn new(rule: &'static str, detail: impl Into<String>) -> Failure {
        Failure {
            rule,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rule `{}` broken: {}", self.rule, self.detail)
    }
}

impl std::error::Error for Failure {}

/// Result of one check.
pub type Outcome = Result<(), Failure>;

/// A component built once per test binary and shared by its checks (one at a time). Once as
/// many checks as it has `users` have run, it is dropped (a vLLM server stops), so a suite run
/// with one test thread holds one expensive component at a time.
pub struct Shared<H> {
    cell: Mutex<(Option<H>, usize)>,
    users: usize,
}

impl<H> Shared<H> {
    /// An empty cell (for a `static`) for `users` checks.
    pub const fn new(users: usize) -> Self {
        Shared {
            cell: Mutex::new((None, 0)),
            users,
        }
    }

    fn lock(&self) -> MutexGuard<'_, (Option<H>, usize)> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a finished check; drops the component after the last one.
    fn done(&self, cell: &mut (Option<H>, usize)) {
        cell.1 += 1;
        if cell.1 >= self.users {
            cell.0 = None;
        }
    }
}

/// How many checks of `groups` use the component of `role` (`engine`, `pair_engine` or
/// `trainer`, which the `trainer`, `pair` and `features` groups share): the suite macro sizes
/// its [`Shared`] cells with it.
pub const fn users(groups: &[&str], role: &str) -> usize {
    const fn eq(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }
    let mut n = 0;
    let mut i = 0;
    while i < groups.len() {
        let g = groups[i];
        if eq(role, "engine") && eq(g, "engine") {
            n += ENGINE_CHECKS;
        }
        if eq(role, "pair_engine") && eq(g, "pair") {
            n += PAIR_CHECKS;
        }
        if eq(role, "trainer") && eq(g, "trainer") {
            n += TRAINER_CHECKS;
        }
        if eq(role, "trainer") && eq(g, "pair") {
            n += PAIR_CHECKS;
        }
        if eq(role, "trainer") && eq(g, "features") {
            n += FEATURE_CHECKS;
        }
        i += 1;
    }
    n
}

/// Checks per group (the suite macro's lists).
const ENGINE_CHECKS: usize = 8;
const TRAINER_CHECKS: usize = 6;
const PAIR_CHECKS: usize = 3;
const FEATURE_CHECKS: usize = 3;

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

/// Runs `check` on the shared harness in `cell` (built from `build` when empty), catching a
/// panic as a failure; `reset` brings a harness back to its base state after a passing check.
fn run_in<H>(
    cell: &mut Option<H>,
    build: impl FnOnce() -> Result<H, Failure>,
    check: impl FnOnce(&mut H) -> Outcome,
    reset: impl FnOnce(&mut H) -> Outcome,
    keep: impl FnOnce(&mut H) -> Option<std::path::PathBuf>,
) -> Outcome {
    if cell.is_none() {
        *cell = Some(build()?);
    }
    let Some(h) = cell.as_mut() else {
        return Err(Failure::new("setup", "the component was not built"));
    };
    let result = catch_unwind(AssertUnwindSafe(|| check(h)))
        .unwrap_or_else(|p| Err(Failure::new("no panic", panic_text(p.as_ref()))))
        .and_then(|()| reset(h));
    if let Err(f) = &result {
        // A failed check may leave the component anywhere: the next check gets a fresh one.
        // Its run dir (logs) stays for the reader.
        let kept = keep(h);
        *cell = None;
        if let Some(dir) = kept {
            return Err(Failure::new(
                f.rule,
                format!(
                    "{} (its run dir, with logs, is kept at {})",
                    f.detail,
                    dir.display()
                ),
            ));
        }
    }
    result
}

fn report(name: &str, outcome: Outcome) {
    if let Err(f) = outcome {
        panic!("conformance check `{name}` failed: {f}");
    }
}

/// Runs an engine check on the shared engine (built from `setup` on first use).
pub fn run_engine(
    name: &str,
    shared: &Shared<EngineHarness>,
    setup: fn() -> EngineSetup,
    check: fn(&mut EngineHarness) -> Outcome,
) {
    run_shared(
        name,
        shared,
        || EngineHarness::new(setup()),
        check,
        EngineHarness::to_serving,
        EngineHarness::keep_run_dir,
    );
}

/// Runs a trainer check on the shared trainer (built from `setup` on first use).
pub fn run_trainer(
    name: &str,
    shared: &Shared<TrainerHarness>,
    setup: fn() -> TrainerSetup,
    check: fn(&mut TrainerHarness) -> Outcome,
) {
    run_shared(
        name,
        shared,
        || TrainerHarness::new(setup()),
        check,
        |_| Ok(()),
        TrainerHarness::keep_run_dir,
    );
}

/// [`run_in`] on the component `shared` holds, counting the check as one of its users, then
/// reports the outcome (outside the lock).
fn run_shared<H>(
    name: &str,
    shared: &Shared<H>,
    build: impl FnOnce() -> Result<H, Failure>,
    check: impl FnOnce(&mut H) -> Outcome,
    reset: impl FnOnce(&mut H) -> Outcome,
    keep: impl FnOnce(&mut H) -> Option<std::path::PathBuf>,
) {
    let mut cell = shared.lock();
    let outcome = run_in(&mut cell.0, build, check, reset, keep);
    shared.done(&mut cell);
    drop(cell);
    report(name, outcome);
}

/// Runs an engine + trainer check (locks the engine first, then the trainer).
pub fn run_pair(
    name: &str,
    engines: (&Shared<EngineHarness>, fn() -> EngineSetup),
    trainers: (&Shared<TrainerHarness>, fn() -> TrainerSetup),
    check: fn(&mut EngineHarness, &mut TrainerHarness) -> Outcome,
) {
    let mut e_cell = engines.0.lock();
    let mut t_cell = trainers.0.lock();
    let outcome = pair_in(&mut e_cell.0, &mut t_cell.0, engines.1, trainers.1, check);
    engines.0.done(&mut e_cell);
    trainers.0.done(&mut t_cell);
    drop((e_cell, t_cell));
    report(name, outcome);
}

fn pair_in(
    e_cell: &mut Option<EngineHarness>,
    t_cell: &mut Option<TrainerHarness>,
    engine: fn() -> EngineSetup,
    trainer: fn() -> TrainerSetup,
    check: fn(&mut EngineHarness, &mut TrainerHarness) -> Outcome,
) -> Outcome {
    if t_cell.is_none() {
        *t_cell = Some(TrainerHarness::new(trainer())?);
    }
    let Some(t) = t_cell.as_mut() else {
        return Err(Failure::new("setup", "no trainer"));
    };
    let mut trainer_broken = false;
    let outcome = run_in(
        e_cell,
        || EngineHarness::new(engine()),
        |e| {
            let r = check(e, t);
            trainer_broken = r.is_err();
            r
        },
        EngineHarness::to_serving,
        EngineHarness::keep_run_dir,
    );
    if trainer_broken {
        t.keep_run_dir();
        *t_cell = None;
    }
    outcome
}

/// The setup functions of a bridge check: the bridge, the engine, the trainer.
pub type BridgeSetups = (
    fn() -> BridgeSetup,
    fn() -> EngineSetup,
    fn() -> TrainerSetup,
);

/// A bridge check (see [`crate::checks::bridge`]).
pub type BridgeCheck = fn(&BridgeSetup, &EngineSetup, &TrainerSetup) -> Outcome;

/// Runs a bridge check: the bridge, engine and trainer setups it is given build what the
/// check needs (a sync builds an engine and a trainer of its own, whose services carry the
/// bridge's transport group), so no shared component is involved.
pub fn run_bridge(name: &str, setups: BridgeSetups, check: BridgeCheck) {
    let (b, e, t) = (setups.0(), setups.1(), setups.2());
    let outcome = catch_unwind(AssertUnwindSafe(|| check(&b, &e, &t)))
        .unwrap_or_else(|p| Err(Failure::new("no panic", panic_text(p.as_ref()))));
    report(name, outcome);
}
