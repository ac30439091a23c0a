//! The RL crate's error: a bad job, a failure of the loop, or one of the runtime's, each with
//! its way to fix it as data ([`RlError::help`]) and its exit code.

use crate::config::ConfigError;
use tandem_plugin_api::PluginError;
use tandem_runtime::{Message, RuntimeError};

/// Errors of job validation and of the RL loop.
#[derive(Debug, thiserror::Error)]
pub enum RlError {
    /// The job file is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The runtime failed (a plugin, a worker, the control plane).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Bad input outside the job file (a model directory, a run directory, arguments).
    #[error("{0}")]
    Usage(Message),
    /// A failure of the loop while running.
    #[error("{0}")]
    Failed(Message),
    /// A model file or directory (completing a checkpoint, merging an adapter).
    #[error(transparent)]
    Model(#[from] tandem_model::ModelError),
    /// I/O failure with context.
    #[error("{context}: {source}")]
    Io {
        /// What the loop was doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl RlError {
    /// Bad input.
    pub fn usage(text: impl Into<String>) -> Self {
        RlError::Usage(Message::from(text.into()))
    }

    /// A failure while running.
    pub fn failed(text: impl Into<String>) -> Self {
        RlError::Failed(Message::from(text.into()))
    }

    /// Wraps a plugin error with what the loop was doing.
    pub fn plugin(context: impl Into<String>, source: PluginError) -> Self {
        RlError::Runtime(RuntimeError::plugin(context, source))
    }

    /// I/O failure while doing `context`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| RlError::Io { context, source }
    }

    /// Attaches how to fix it (to [`RlError::Usage`] and [`RlError::Failed`]).
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        if let RlError::Usage(m) | RlError::Failed(m) = &mut self {
            m.help = Some(help.into());
        }
        self
    }

    /// How to fix it, when there is something to say.
    pub fn help(&self) -> Option<String> {
        match self {
            RlError::Usage(m) | RlError::Failed(m) => m.help.clone(),
            RlError::Runtime(r) => r.help(),
            RlError::Config(c) => c.help(),
            RlError::Model(m) => m.help().map(str::to_string),
            RlError::Io { .. } => None,
        }
    }

    /// Process exit code: 2 for user errors (bad job, bad input), 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            RlError::Config(_) | RlError::Usage(_) => 2,
            RlError::Runtime(r) => r.exit_code(),
            RlError::Model(tandem_model::ModelError::Invalid { .. }) => 2,
            RlError::Failed(_) | RlError::Io { .. } | RlError::Model(_) => 1,
        }
    }
}

impl From<tandem_control::ControlError> for RlError {
    fn from(err: tandem_control::ControlError) -> Self {
        RlError::Runtime(err.into())
    }
}
