//! The command line's error: its own bad arguments, or the error of the crate it called; each
//! with its way to fix it as data ([`CliError::help`]) and its exit code.

use tandem_rl::RlError;
use tandem_runtime::{Message, RuntimeError};

/// Errors of a `tandem` subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A job, the loop or a model tool failed.
    #[error(transparent)]
    Rl(#[from] RlError),
    /// The runtime failed (plugins, workers, the control plane).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Bad arguments.
    #[error("{0}")]
    Usage(Message),
    /// A failure while running a command.
    #[error("{0}")]
    Failed(Message),
    /// I/O failure with context.
    #[error("{context}: {source}")]
    Io {
        /// What the command was doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl CliError {
    /// Bad arguments.
    pub fn usage(text: impl Into<String>) -> Self {
        CliError::Usage(Message::from(text.into()))
    }

    /// A failure while running.
    pub fn failed(text: impl Into<String>) -> Self {
        CliError::Failed(Message::from(text.into()))
    }

    /// Wraps a plugin error with what the command was doing.
    pub fn plugin(context: impl Into<String>, source: tandem_plugin_api::PluginError) -> Self {
        CliError::Runtime(RuntimeError::plugin(context, source))
    }

    /// Attaches how to fix it (to [`CliError::Usage`] and [`CliError::Failed`]).
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        if let CliError::Usage(m) | CliError::Failed(m) = &mut self {
            m.help = Some(help.into());
        }
        self
    }

    /// How to fix it, when there is something to say.
    pub fn help(&self) -> Option<String> {
        match self {
            CliError::Usage(m) | CliError::Failed(m) => m.help.clone(),
            CliError::Rl(e) => e.help(),
            CliError::Runtime(e) => e.help(),
            CliError::Io { .. } => None,
        }
    }

    /// Process exit code: 2 for user errors, 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Rl(e) => e.exit_code(),
            CliError::Runtime(e) => e.exit_code(),
            CliError::Failed(_) | CliError::Io { .. } => 1,
        }
    }

    /// The lines a user sees on stderr: the message (one line per error it carries), its help
    /// on the last line.
    pub fn lines(&self) -> Vec<String> {
        let text = self.to_string();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if let (Some(last), Some(help)) = (lines.last_mut(), self.help()) {
            *last = tandem_runtime::error::render(last, Some(&help));
        }
        lines
    }
}

impl From<tandem_rl::config::ConfigError> for CliError {
    fn from(err: tandem_rl::config::ConfigError) -> Self {
        CliError::Rl(err.into())
    }
}

impl From<tandem_control::ControlError> for CliError {
    fn from(err: tandem_control::ControlError) -> Self {
        CliError::Runtime(err.into())
    }
}
