//! The RL loop: `tandem run` launches the workers, then alternates rollouts on the engines
//! and GRPO steps on the trainer, with the drained offload and the staged onload between
//! them (see `ARCHITECTURE.md`, "The step").
//!
//! - [`driver`]: the loop itself (init, steps, shutdown) over remote engines and a trainer.
//! - [`phases`]: the drained offload / staged onload sequences and the engine state machines.
//! - [`rollout`]: prompts → generation on every engine → decoded, rewarded samples.
//! - [`grpo`]: group-relative advantages and train batches.
//! - [`checkpoint`]: complete checkpoints every N steps and `--resume`.
//! - [`warmstart`]: creating a preset model and its supervised warm start.
//! - [`events`], [`metrics`], [`plot`], [`progress`]: what a run writes and shows.

pub mod checkpoint;
pub mod driver;
pub mod events;
pub mod grpo;
pub mod metrics;
pub mod phases;
pub mod plot;
pub mod progress;
pub mod prompt;
pub mod rollout;
pub mod warmstart;

pub use driver::{RunOptions, RunSummary, run};
