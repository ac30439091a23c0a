//! Error type of the native backend: every failure is one record saying what went wrong,
//! where, and how to fix it.

use std::path::PathBuf;

/// Errors returned by the native backend.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// A file could not be read or written.
    #[error("I/O error on {path}: {source} (check the path exists and is readable/writable)")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A JSON file (config.json, adapter_config.json, index) is malformed.
    #[error("invalid JSON in {path}: {message}")]
    Json {
        /// The file involved.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The model configuration is not supported or inconsistent.
    #[error("unsupported or invalid model config: {0}")]
    Config(String),
    /// A safetensors file is malformed or does not match the model.
    #[error("safetensors error in {path}: {message}")]
    Safetensors {
        /// The file involved.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A tensor name or shape does not match the expected parameter layout.
    #[error("parameter mismatch: {0}")]
    Param(String),
    /// A buffer handed in by the provider has the wrong size, or allocation failed.
    #[error("buffer error: {0}")]
    Buffer(String),
    /// Invalid arguments to a compute call (bad token id, empty batch, shape mismatch...).
    #[error("invalid input: {0}")]
    Input(String),
    /// Tokenizer training, loading or encoding failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
}

/// Result alias for the native backend.
pub type Result<T> = std::result::Result<T, NativeError>;

impl NativeError {
    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        NativeError::Io {
            path: path.into(),
            source,
        }
    }
}
