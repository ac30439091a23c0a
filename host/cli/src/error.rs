//! The command line's error: its own bad arguments, or the error of the crate it called; each
//! with its way to fix it as data ([`CliError::help`]) and its exit code.

use tandem_rl::RlError;
use tandem_runtime::RuntimeError;

/// Errors of a `tandem` subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A job, the loop or a model tool failed; also the command's own bad arguments, failures
    /// and I/O errors ([`RlError::Usage`], [`RlError::Failed`], [`RlError::Io`]).
    #[error(transparent)]
    Rl(#[from] RlError),
    /// The runtime failed (plugins, workers, the control plane).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl CliError {
    /// Bad arguments.
    pub fn usage(text: impl Into<String>) -> Self {
        RlError::usage(text).into()
    }

    /// A failure while running.
    pub fn failed(text: impl Into<String>) -> Self {
        RlError::failed(text).into()
    }

    /// I/O failure while doing `context`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let io = RlError::io(context);
        move |source| io(source).into()
    }

    /// Wraps a plugin error with what the command was doing.
    pub fn plugin(context: impl Into<String>, source: tandem_plugin_api::PluginError) -> Self {
        CliError::Runtime(RuntimeError::plugin(context, source))
    }

    /// Attaches how to fix it (to the command's own usage errors and failures).
    #[must_use]
    pub fn with_help(self, help: impl Into<String>) -> Self {
        match self {
            CliError::Rl(e) => e.with_help(help).into(),
            other => other,
        }
    }

    /// How to fix it, when there is something to say.
    pub fn help(&self) -> Option<String> {
        match self {
            CliError::Rl(e) => e.help(),
            CliError::Runtime(e) => e.help(),
        }
    }

    /// Process exit code: 2 for user errors, 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Rl(e) => e.exit_code(),
            CliError::Runtime(e) => e.exit_code(),
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

impl From<tandem_model::ModelError> for CliError {
    fn from(err: tandem_model::ModelError) -> Self {
        CliError::Rl(err.into())
    }
}

impl From<tandem_control::ControlError> for CliError {
    fn from(err: tandem_control::ControlError) -> Self {
        CliError::Runtime(err.into())
    }
}
