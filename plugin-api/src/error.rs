//! The error record that crosses the ABI: `{code, message, help}`.
//!
//! `message` says what went wrong and where; `help` says how to fix it (may be empty).

use abi_stable::StableAbi;
use abi_stable::std_types::{RResult, RString};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Result type of every fallible call across the plugin boundary.
pub type PResult<T> = RResult<T, PluginError>;

/// Broad class of a plugin error; the host maps it to exit codes and retry decisions.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The caller passed something invalid (bad config, bad batch, unknown name).
    InvalidInput,
    /// The component does not implement this operation (see its declared capabilities).
    NotSupported,
    /// A host service the call needs is not available in this build or process.
    NotAvailable,
    /// The call is illegal in the component's current state (e.g. generate while paused).
    InvalidState,
    /// File-system or network I/O failed.
    Io,
    /// A peer process or server is unreachable, died, or did not answer in time.
    Unavailable,
    /// A deadline passed.
    Timeout,
    /// The operation was cancelled through the host's cancellation flag.
    Cancelled,
    /// Data was corrupt or inconsistent (checksum, digest, layout mismatch).
    Corrupt,
    /// Any other runtime failure inside the plugin.
    Runtime,
    /// The plugin panicked; the panic was caught at the boundary.
    Panicked,
}

impl ErrorCode {
    /// Lower-case name used in logs and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidInput => "invalid_input",
            ErrorCode::NotSupported => "not_supported",
            ErrorCode::NotAvailable => "not_available",
            ErrorCode::InvalidState => "invalid_state",
            ErrorCode::Io => "io",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Corrupt => "corrupt",
            ErrorCode::Runtime => "runtime",
            ErrorCode::Panicked => "panicked",
        }
    }
}

/// The error record every plugin call returns on failure.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PluginError {
    /// Broad class of the error.
    pub code: ErrorCode,
    /// What went wrong and where, in one line.
    pub message: RString,
    /// How to fix it, in one line; empty when there is nothing useful to say.
    pub help: RString,
}

impl PluginError {
    /// An error with a code and a message and no help text.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        PluginError {
            code,
            message: RString::from(message.into()),
            help: RString::new(),
        }
    }

    /// Adds a help line.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = RString::from(help.into());
        self
    }

    /// Shorthand for [`ErrorCode::InvalidInput`].
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidInput, message)
    }

    /// Shorthand for [`ErrorCode::NotSupported`] naming the operation and the component.
    pub fn not_supported(operation: &str, component: &str) -> Self {
        Self::new(
            ErrorCode::NotSupported,
            format!("`{component}` does not support `{operation}`"),
        )
        .with_help("check the component's declared capabilities with `tandem plugins`")
    }

    /// Shorthand for [`ErrorCode::InvalidState`].
    pub fn invalid_state(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidState, message)
    }

    /// Shorthand for [`ErrorCode::Runtime`].
    pub fn runtime(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Runtime, message)
    }

    /// Shorthand for [`ErrorCode::Io`].
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Io, message)
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.message, self.code.as_str())?;
        if !self.help.is_empty() {
            write!(f, " (help: {})", self.help)?; // tidy: help-format
        }
        Ok(())
    }
}

impl std::error::Error for PluginError {}

impl From<std::io::Error> for PluginError {
    fn from(err: std::io::Error) -> Self {
        PluginError::io(err.to_string())
    }
}
