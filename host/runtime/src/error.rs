//! The runtime's error type: what went wrong, and — as data, never pasted into the message —
//! how to fix it ([`RuntimeError::help`]). The binary edge renders both on one line and maps
//! the error to an exit code ([`RuntimeError::exit_code`]).

use crate::registry::LoadError;
use tandem_control::ControlError;
use tandem_plugin_api::{ErrorCode, PluginError};

/// A message with an optional way to fix it. Displays as the message alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// What happened, and where.
    pub text: String,
    /// How to fix it, if there is something to say.
    pub help: Option<String>,
}

impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<String> for Message {
    fn from(text: String) -> Self {
        Message { text, help: None }
    }
}

impl From<&str> for Message {
    fn from(text: &str) -> Self {
        Message::from(text.to_owned())
    }
}

/// One line for a user: the message, then how to fix it when there is something to say. The
/// one place host errors render their help (plugin errors render theirs in `PluginError`'s
/// `Display`).
pub fn render(message: &str, help: Option<&str>) -> String {
    match help {
        Some(h) => format!("{message} (help: {h})"), // tidy: help-format
        None => message.to_owned(),
    }
}

/// Errors of the registry, the workers, the launcher and the remote handles.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// One or more plugins could not be loaded.
    #[error("{}", .0.iter().map(|e| render(&e.to_string(), e.help().as_deref())).collect::<Vec<_>>().join("\n"))]
    Plugins(Vec<LoadError>),
    /// A plugin call failed.
    #[error("{context}: {source}")]
    Plugin {
        /// What the host was doing.
        context: String,
        /// The plugin's error.
        source: PluginError,
    },
    /// The control plane failed (timeout, lost worker, protocol).
    #[error(transparent)]
    Control(ControlError),
    /// Bad input: arguments, files, a request the component cannot serve.
    #[error("{0}")]
    Usage(Message),
    /// A failure while running.
    #[error("{0}")]
    Runtime(Message),
    /// I/O failure with context.
    #[error("{context}: {source}")]
    Io {
        /// What the host was doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl RuntimeError {
    /// Bad input.
    pub fn usage(text: impl Into<String>) -> Self {
        RuntimeError::Usage(Message::from(text.into()))
    }

    /// A failure while running.
    pub fn runtime(text: impl Into<String>) -> Self {
        RuntimeError::Runtime(Message::from(text.into()))
    }

    /// Wraps a plugin error with what the host was doing.
    pub fn plugin(context: impl Into<String>, source: PluginError) -> Self {
        RuntimeError::Plugin {
            context: context.into(),
            source,
        }
    }

    /// I/O failure while doing `context`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| RuntimeError::Io { context, source }
    }

    /// Attaches how to fix it (to [`RuntimeError::Usage`] and [`RuntimeError::Runtime`]; other
    /// variants carry their own).
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        if let RuntimeError::Usage(m) | RuntimeError::Runtime(m) = &mut self {
            m.help = Some(help.into());
        }
        self
    }

    /// How to fix it, when there is something to say.
    pub fn help(&self) -> Option<String> {
        match self {
            RuntimeError::Usage(m) | RuntimeError::Runtime(m) => m.help.clone(),
            RuntimeError::Control(c) => c.help().map(str::to_owned),
            // A plugin error displays its own help; each load error's is on its own line.
            RuntimeError::Plugin { .. } | RuntimeError::Plugins(_) | RuntimeError::Io { .. } => {
                None
            }
        }
    }

    /// Process exit code: 2 for user errors (bad plugin, bad input), 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            RuntimeError::Plugins(_) | RuntimeError::Usage(_) => 2,
            RuntimeError::Plugin { source, .. } if source.code == ErrorCode::InvalidInput => 2,
            _ => 1,
        }
    }
}

impl From<ControlError> for RuntimeError {
    fn from(err: ControlError) -> Self {
        match err {
            ControlError::Remote { peer, op, error } => {
                RuntimeError::plugin(format!("{peer}: `{op}`"), error)
            }
            other => RuntimeError::Control(other),
        }
    }
}
