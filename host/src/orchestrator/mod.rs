//! Orchestration of engines and trainers across worker processes.
//!
//! - [`state`]: the engine lifecycle state machine (legal transitions only).

pub mod state;

pub use state::{EngineMachine, EngineOp, EngineState, TransitionError};
