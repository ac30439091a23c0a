//! A trainer that is a torchrun job of Python ranks driven over a control channel: what the
//! `fsdp` and `megatron` plugins share, so each adds only its options and its worker package.
//!
//! - [`Job`]: what differs between such trainers (name, embedded worker package, Python
//!   modules it needs, exports, releasable tags).
//! - [`worker`]: writes the packages, checks the interpreter, launches `python -m
//!   torch.distributed.run` as a supervised process group, accepts rank 0 (run token), one
//!   request/reply per operation with a deadline; a dead job breaks the worker for good.
//! - [`channel`]: length-prefixed JSON frames with deadline-aware reads.
//! - [`trainer`]: the trainer ABI mapped onto the worker's operations.
//! - [`options`]: checks and the interpreter lookup shared by the plugins' options.
//!
//! The Python half is the package `tandem_torchrun` (`plugins/support/python/`), embedded
//! here and written beside the plugin's own worker package: the rank loop, the channel, the
//! loss, padded batches, the file contract's twin and the exports (versions, `st256` digests
//! of the tensors written), snapshots / memory tags / stats.

pub mod channel;
pub mod options;
pub mod trainer;
pub mod worker;

use tandem_plugin_api::UpdateKind;

pub use trainer::TorchrunTrainer;
pub use worker::{Launch, Worker};

/// A file of an embedded Python package: name and text.
pub type PackageFile = (&'static str, &'static str);

/// The shared Python package `tandem_torchrun`.
pub const SHARED_PACKAGE: (&str, &[PackageFile]) = (
    "tandem_torchrun",
    &[
        (
            "__init__.py",
            include_str!("../../python/tandem_torchrun/__init__.py"),
        ),
        (
            "batch.py",
            include_str!("../../python/tandem_torchrun/batch.py"),
        ),
        (
            "channel.py",
            include_str!("../../python/tandem_torchrun/channel.py"),
        ),
        (
            "export.py",
            include_str!("../../python/tandem_torchrun/export.py"),
        ),
        (
            "files.py",
            include_str!("../../python/tandem_torchrun/files.py"),
        ),
        (
            "loss.py",
            include_str!("../../python/tandem_torchrun/loss.py"),
        ),
        (
            "rank.py",
            include_str!("../../python/tandem_torchrun/rank.py"),
        ),
        (
            "state.py",
            include_str!("../../python/tandem_torchrun/state.py"),
        ),
    ],
);

/// What one torchrun trainer plugin is.
#[derive(Debug)]
pub struct Job {
    /// Component name (`fsdp`): every error starts with ``trainer `fsdp` ``.
    pub component: &'static str,
    /// The worker package: module name (run with `-m`) and its files.
    pub package: (&'static str, &'static [PackageFile]),
    /// Python modules the interpreter must find before torchrun starts.
    pub needs: &'static [&'static str],
    /// Update kinds the trainer exports.
    pub exports: &'static [UpdateKind],
    /// Memory tags the trainer frees on CPU; other tags are refused.
    pub releasable: &'static [&'static str],
    /// Why only those tags (the help of the refusal).
    pub releasable_help: &'static str,
}

impl Job {
    /// ``trainer `NAME` ``: how every message of this trainer starts.
    pub fn what(&self) -> String {
        format!("trainer `{}`", self.component)
    }
}
