//! Running a check: the shared component cell, failures that name the rule, and the runners
//! the suite macros call.

use crate::engine::EngineHarness;
use crate::setup::{EngineSetup, TrainerSetup};
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

/// A component built once per test binary and shared by its checks (one at a time).
pub struct Shared<H> {
    cell: Mutex<Option<H>>,
}

impl<H> Shared<H> {
    /// An empty cell (for a `static`).
    pub const fn new() -> Self {
        Shared {
            cell: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<H>> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<H> Default for Shared<H> {
    fn default() -> Self {
        Self::new()
    }
}

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
    if result.is_err() {
        // A failed check may leave the component anywhere: the next check gets a fresh one.
        *cell = None;
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
    let mut cell = shared.lock();
    report(
        name,
        run_in(
            &mut cell,
            || EngineHarness::new(setup()),
            check,
            EngineHarness::to_serving,
        ),
    );
}

/// Runs a trainer check on the shared trainer (built from `setup` on first use).
pub fn run_trainer(
    name: &str,
    shared: &Shared<TrainerHarness>,
    setup: fn() -> TrainerSetup,
    check: fn(&mut TrainerHarness) -> Outcome,
) {
    let mut cell = shared.lock();
    report(
        name,
        run_in(&mut cell, || TrainerHarness::new(setup()), check, |_| Ok(())),
    );
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
    if t_cell.is_none() {
        match TrainerHarness::new((trainers.1)()) {
            Ok(t) => *t_cell = Some(t),
            Err(f) => report(name, Err(f)),
        }
    }
    let Some(t) = t_cell.as_mut() else {
        return report(name, Err(Failure::new("setup", "no trainer")));
    };
    let mut trainer_broken = false;
    let outcome = run_in(
        &mut e_cell,
        || EngineHarness::new((engines.1)()),
        |e| {
            let r = check(e, t);
            trainer_broken = r.is_err();
            r
        },
        EngineHarness::to_serving,
    );
    if trainer_broken {
        *t_cell = None;
    }
    report(name, outcome);
}
