//! Experiment tracking. A run's `metrics.jsonl` is the source of truth; this crate sends its
//! lines to the trackers a job names in `[logging]`:
//!
//! - **TensorBoard**: event files written here (`tensorboard`: the TFRecord framing and the
//!   four protobuf messages TensorBoard reads), one scalar per numeric field of a line
//!   (nested ones as `phases/train`), and the job file as text.
//! - **Weights & Biases**: the `wandb` Python package in a sidecar process the run owns
//!   (`wandb`; Rust has no maintained client), online or offline.
//! - **MLflow**: its REST API over HTTP(S) (`mlflow`): metrics, the resolved plan as params,
//!   the final checkpoint as a tag.
//!
//! Each tracker keeps a cursor (the last step it acknowledged) in `<run dir>/tracking.json`
//! (`state`). A tracker that is down costs one warning line and nothing else: the lines it
//! missed are its backlog, sent when it answers again, at the end of the run, or by
//! `tandem log push RUN_DIR` ([`push`]). A resumed run continues the same W&B and MLflow runs.
//! The run's loop never waits for a tracker: [`Tracker`] sends from its own thread.

#![forbid(unsafe_code)]

mod error;
mod flatten;
mod mlflow;
mod section;
mod sinks;
mod state;
pub mod tensorboard;
mod wandb;
mod worker;

pub use error::TrackError;
pub use flatten::{Line, read_lines};
pub use section::{
    LoggingSection, MlflowPlan, MlflowSection, TensorboardSetting, TrackPlan, WandbMode, WandbPlan,
    WandbSection, track_python,
};
pub use sinks::{PushReport, RunInfo, push};
pub use state::{STATE_FILE, TrackState};
pub use worker::Tracker;
