//! [`ModelError`]: what went wrong with a model file, where, and how to fix it.

use std::path::PathBuf;

/// An error of model-file work. `Display` is one line naming the file; [`ModelError::help`]
/// says how to fix it when there is something to say.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The input is not what it should be (bad format, unsupported content).
    #[error("{path}: {message}")]
    Invalid {
        /// The offending input.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// How to fix it.
        help: Option<String>,
    },
}

impl ModelError {
    /// An I/O error at `path`, for `map_err`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
        let path = path.into();
        move |source| ModelError::Io { path, source }
    }

    /// Invalid input at `path`.
    pub fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> ModelError {
        ModelError::Invalid {
            path: path.into(),
            message: message.into(),
            help: None,
        }
    }

    /// Adds how to fix it.
    pub fn with_help(self, text: impl Into<String>) -> ModelError {
        match self {
            ModelError::Invalid { path, message, .. } => ModelError::Invalid {
                path,
                message,
                help: Some(text.into()),
            },
            other => other,
        }
    }

    /// How to fix it, if known.
    pub fn help(&self) -> Option<&str> {
        match self {
            ModelError::Invalid { help, .. } => help.as_deref(),
            ModelError::Io { .. } => None,
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
