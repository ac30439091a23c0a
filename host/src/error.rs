//! The host's error type and its mapping to exit codes: 2 for user errors (bad job file, bad
//! plugin, bad arguments), 1 for runtime failures.

use crate::config::ConfigError;
use crate::registry::LoadError;
use tandem_plugin_api::PluginError;

/// Errors of host operations.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The job file is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// One or more plugins could not be loaded.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Plugins(Vec<LoadError>),
    /// A plugin call failed.
    #[error("{context}: {source}")]
    Plugin {
        /// What the host was doing.
        context: String,
        /// The plugin's error.
        source: PluginError,
    },
    /// Bad command-line usage or input not covered by the job file.
    #[error("{0}")]
    Usage(String),
    /// A failure while running.
    #[error("{0}")]
    Runtime(String),
    /// I/O failure with context.
    #[error("{context}: {source}")]
    Io {
        /// What the host was doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl HostError {
    /// Process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            HostError::Config(_) | HostError::Plugins(_) | HostError::Usage(_) => 2,
            HostError::Plugin { source, .. }
                if source.code == tandem_plugin_api::ErrorCode::InvalidInput =>
            {
                2
            }
            _ => 1,
        }
    }

    /// Wraps a plugin error with what the host was doing.
    pub fn plugin(context: impl Into<String>, source: PluginError) -> Self {
        HostError::Plugin {
            context: context.into(),
            source,
        }
    }
}
