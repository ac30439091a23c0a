//! Orchestration of engines and trainers across worker processes.
//!
//! - [`state`]: the engine lifecycle state machine (legal transitions only). It lives in
//!   `tandem_plugin_api::lifecycle` so that engine plugins and `tandem-conformance` hold
//!   engines to the same rules the host checks.

/// The engine lifecycle state machine, shared with plugins.
pub mod state {
    pub use tandem_plugin_api::lifecycle::*;
}

pub use state::{EngineMachine, EngineOp, EngineState, TransitionError};
