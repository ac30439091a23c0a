//! The engine lifecycle state machine: which calls are legal in which state. It is the one
//! statement of the engine contract's ordering rules: the host checks every engine against it
//! before each call, engine plugins enforce it with the same type, and `tandem-conformance`
//! holds every engine to it as the oracle of its random operation sequences.
//!
//! ```text
//!            pause                flush
//!  Serving ─────────▶ Paused ─────────────▶ Flushed
//!     ▲   continue      │  ▲ │                │
//!     └─────────────────┘  │ │ release(T)     │ release(T)
//!     ▲ continue (Flushed) │ ▼                ▼
//!     └──────────────  Released(T) ◀──────────┘
//!                        │   ▲  release(U): T ∪ U     resume(U ⊆ T): T \ U,
//!                        │   │                        or Paused when T \ U = ∅
//!          begin_update(v)   │ end_update / abort_update
//!   (from Paused, Flushed,   ▼
//!    or Released(T) with    Updating(v) — remembers T; back to Released(T) or Paused
//!    `weights` ∉ T)
//! ```
//!
//! The drained offload is pause → flush → release; the staged onload is resume(weights) →
//! begin/end update → resume(kv_cache) → continue. Rules worth stating:
//! - Generation ([`EngineMachine::can_generate`]) only in Serving, and Serving is reachable only
//!   through `continue` from Paused or Flushed, i.e. never while any tag is released.
//! - Flush only from Paused (a released engine has nothing to flush; flushing twice is an
//!   ordering bug). Release only after a pause; a tag released twice is an error.
//! - An update needs the weights resident (`weights` not released), and its version must not
//!   be below the served one: versions never go down, and change only at `end_update`.
//!   Re-applying the served version is legal (an engine restarted on a checkpoint acknowledges
//!   it; a restarted engine is re-synced to the version it already reports).
//! - A rejected operation leaves the machine unchanged; its error names the current state and
//!   the attempted operation.

use crate::types::tags::WEIGHTS;
use std::collections::BTreeSet;
use std::fmt;

/// A set of memory tags.
pub type Tags = BTreeSet<String>;

/// Where an engine is in its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineState {
    /// Taking generation requests.
    Serving,
    /// No new work; caches and memory intact.
    Paused,
    /// Paused with its prefix / KV cache flushed.
    Flushed,
    /// Paused with the memory of these tags released (never empty).
    Released(Tags),
    /// Applying the weight update of this version; `released` is what stays released.
    Updating {
        /// Version being applied.
        version: u64,
        /// Tags released when the update began (returned to afterwards).
        released: Tags,
    },
}

/// A lifecycle operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineOp {
    /// `pause_generation`.
    Pause,
    /// `flush_cache`.
    Flush,
    /// `release_memory(tags)`.
    Release(Tags),
    /// `resume_memory(tags)`.
    Resume(Tags),
    /// Start applying a weight update of this version.
    BeginUpdate(u64),
    /// The update was applied: the engine now serves its version.
    EndUpdate,
    /// The update failed: the engine keeps its old weights and version.
    AbortUpdate,
    /// `continue_generation`.
    Continue,
}

fn list(tags: &Tags) -> String {
    tags.iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for EngineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineState::Serving => f.write_str("Serving"),
            EngineState::Paused => f.write_str("Paused"),
            EngineState::Flushed => f.write_str("Flushed"),
            EngineState::Released(t) => write!(f, "Released({})", list(t)),
            EngineState::Updating { version, .. } => write!(f, "Updating(v{version})"),
        }
    }
}

impl fmt::Display for EngineOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineOp::Pause => f.write_str("pause"),
            EngineOp::Flush => f.write_str("flush"),
            EngineOp::Release(t) => write!(f, "release({})", list(t)),
            EngineOp::Resume(t) => write!(f, "resume({})", list(t)),
            EngineOp::BeginUpdate(v) => write!(f, "begin_update(v{v})"),
            EngineOp::EndUpdate => f.write_str("end_update"),
            EngineOp::AbortUpdate => f.write_str("abort_update"),
            EngineOp::Continue => f.write_str("continue"),
        }
    }
}

/// An operation that is illegal in the current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionError {
    /// The state the engine was (and stays) in.
    pub state: EngineState,
    /// The rejected operation.
    pub op: EngineOp,
    /// Why, and what would be legal.
    pub why: String,
}

impl fmt::Display for TransitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "illegal engine transition: `{}` in state {}: {}",
            self.op, self.state, self.why
        )
    }
}

impl std::error::Error for TransitionError {}

/// An engine's lifecycle state and served weight version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineMachine {
    state: EngineState,
    version: u64,
}

impl EngineMachine {
    /// A serving engine with weights of `version`.
    pub fn new(version: u64) -> Self {
        EngineMachine {
            state: EngineState::Serving,
            version,
        }
    }

    /// The current state.
    pub fn state(&self) -> &EngineState {
        &self.state
    }

    /// The weight version served.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// `true` only in Serving.
    pub fn can_generate(&self) -> bool {
        self.state == EngineState::Serving
    }

    /// Tags currently released (empty unless Released or Updating).
    pub fn released(&self) -> Tags {
        match &self.state {
            EngineState::Released(t) | EngineState::Updating { released: t, .. } => t.clone(),
            _ => Tags::new(),
        }
    }

    /// Applies `op` if legal; otherwise leaves the machine unchanged.
    pub fn apply(&mut self, op: EngineOp) -> Result<&EngineState, TransitionError> {
        let (state, version) =
            step(&self.state, self.version, &op).map_err(|why| TransitionError {
                state: self.state.clone(),
                op: op.clone(),
                why,
            })?;
        self.state = state;
        self.version = version;
        Ok(&self.state)
    }

    /// [`EngineOp::Pause`].
    pub fn pause(&mut self) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::Pause)
    }
    /// [`EngineOp::Flush`].
    pub fn flush(&mut self) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::Flush)
    }
    /// [`EngineOp::Release`].
    pub fn release<S: AsRef<str>>(&mut self, tags: &[S]) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::Release(to_tags(tags)))
    }
    /// [`EngineOp::Resume`].
    pub fn resume<S: AsRef<str>>(&mut self, tags: &[S]) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::Resume(to_tags(tags)))
    }
    /// [`EngineOp::BeginUpdate`].
    pub fn begin_update(&mut self, version: u64) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::BeginUpdate(version))
    }
    /// [`EngineOp::EndUpdate`].
    pub fn end_update(&mut self) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::EndUpdate)
    }
    /// [`EngineOp::AbortUpdate`].
    pub fn abort_update(&mut self) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::AbortUpdate)
    }
    /// Ends an update begun with [`EngineMachine::begin_update`]: `end_update` when it was
    /// applied (`applied`), else `abort_update`. A no-op outside `Updating`.
    pub fn finish_update(&mut self, applied: bool) {
        let op = if applied {
            EngineOp::EndUpdate
        } else {
            EngineOp::AbortUpdate
        };
        let _ = self.apply(op);
    }
    /// [`EngineOp::Continue`].
    pub fn continue_generation(&mut self) -> Result<&EngineState, TransitionError> {
        self.apply(EngineOp::Continue)
    }
}

fn to_tags<S: AsRef<str>>(tags: &[S]) -> Tags {
    tags.iter().map(|t| t.as_ref().to_string()).collect()
}

/// Paused, or Released(rest) when some tags stay released.
fn paused_or_released(rest: Tags) -> EngineState {
    if rest.is_empty() {
        EngineState::Paused
    } else {
        EngineState::Released(rest)
    }
}

/// The transition function: the next state and version, or why `op` is illegal.
fn step(state: &EngineState, version: u64, op: &EngineOp) -> Result<(EngineState, u64), String> {
    use EngineOp as O;
    use EngineState as S;
    let ok = |s: EngineState| Ok((s, version));
    match (state, op) {
        (_, O::Release(t) | O::Resume(t)) if t.is_empty() => {
            Err("the tag list is empty; name at least one tag".into())
        }
        (S::Serving, O::Pause) => ok(S::Paused),
        (S::Paused, O::Flush) => ok(S::Flushed),
        (S::Paused | S::Flushed, O::Release(t)) => ok(S::Released(t.clone())),
        (S::Released(have), O::Release(t)) => {
            let both: Tags = have.intersection(t).cloned().collect();
            if both.is_empty() {
                ok(S::Released(have.union(t).cloned().collect()))
            } else {
                Err(format!("{} already released", list(&both)))
            }
        }
        (S::Released(have), O::Resume(t)) => {
            let missing: Tags = t.difference(have).cloned().collect();
            if missing.is_empty() {
                ok(paused_or_released(have.difference(t).cloned().collect()))
            } else {
                Err(format!("{} not released", list(&missing)))
            }
        }
        (S::Paused | S::Flushed | S::Released(_), O::BeginUpdate(v)) => {
            let released = match state {
                S::Released(t) => t.clone(),
                _ => Tags::new(),
            };
            if released.contains(WEIGHTS) {
                Err(format!(
                    "the `{WEIGHTS}` are released; resume them before an update"
                ))
            } else if *v < version {
                Err(format!("version {v} is below the served version {version}"))
            } else {
                ok(S::Updating {
                    version: *v,
                    released,
                })
            }
        }
        (
            S::Updating {
                version: v,
                released,
            },
            O::EndUpdate,
        ) => Ok((paused_or_released(released.clone()), *v)),
        (S::Updating { released, .. }, O::AbortUpdate) => ok(paused_or_released(released.clone())),
        (S::Paused | S::Flushed, O::Continue) => ok(S::Serving),
        (S::Released(t), O::Continue) => Err(format!("{} still released; resume first", list(t))),
        (S::Serving, _) => Err("the engine is serving; pause it first".into()),
        (S::Updating { .. }, _) => Err("an update is in progress; end or abort it first".into()),
        (_, O::EndUpdate | O::AbortUpdate) => Err("no update is in progress".into()),
        (_, O::Pause) => Err("the engine is already paused".into()),
        (_, O::Flush) => Err("flush only right after pause (before any release)".into()),
        (_, O::Resume(_)) => Err("nothing is released".into()),
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
