//! `tandem-rl`: an RL job from its file to its run directory.
//!
//! - [`config`]: job files (parsing with positions, the one validation `tandem check` and
//!   `tandem run` share) and [`placement`] (world layout, transport plan).
//! - The loop behind `tandem run` (see `ARCHITECTURE.md`, "The step"): [`driver`] (launch,
//!   init, then each step as a sequence of phases — rollout, drained offload, train, save,
//!   staged onload with the sync, record — and shutdown), [`phases`] (drained offload /
//!   staged onload across all engines, each engine's state machine checked first),
//!   [`rollout`], [`bubble`] (each engine rank's place in the rollout, the schedule of
//!   bubble-time training), [`grpo`], [`checkpoint`], [`warmstart`] (preset model + supervised warm
//!   start), [`prompt`] (plain or chat-template prompts), [`eval`] (held-out accuracy, shared
//!   with `tandem eval`), and what a run writes and shows: [`events`], [`metrics`], [`plot`],
//!   [`progress`].
//! - [`bridge`]: the weight-bridge driver, over any bridge component (the built-in `ipc`,
//!   `lora`, `checkpoint`, `broadcast`, or a third party's).
//! - [`trajectories`]: the exactly-once trajectory ledger (retries, staleness-bounded
//!   admission, snapshot/restore) multi-turn and async RL build on; not used by the loop yet.
//! - [`task`]: built-in verifiable tasks and rewards.

#![forbid(unsafe_code)]

pub mod algorithm;
pub mod bridge;
pub mod bubble;
pub mod checkpoint;
pub mod config;
pub mod driver;
pub mod env;
pub mod error;
pub mod eval;
pub mod events;
pub mod metrics;
pub mod phases;
pub mod placement;
pub mod plot;
pub mod progress;
pub mod prompt;
pub mod rollout;
pub mod trajectories;
pub mod turns;
pub mod warmstart;

pub use driver::{RunOptions, RunSummary, run};
pub use error::RlError;
