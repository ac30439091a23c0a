//! `ServeError`: why `tandem serve` could not start or stopped (the model directory, the
//! engine, the listening socket); request-level failures never become one, they are HTTP
//! answers.

use tandem_runtime::RuntimeError;

/// Errors of the server as a whole.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Bad arguments or model files (a usage error: exit 2).
    #[error("{0}")]
    Usage(String),
    /// The engine could not be constructed or refused a start-up call.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The socket could not be bound or served.
    #[error("{context}: {source}")]
    Io {
        /// What the server was doing.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl ServeError {
    /// A usage error.
    pub fn usage(text: impl Into<String>) -> Self {
        ServeError::Usage(text.into())
    }

    /// An I/O error while doing `context`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| ServeError::Io { context, source }
    }
}

impl From<tandem_model::ModelError> for ServeError {
    /// A model file of the served directory (`config.json`, `generation_config.json`).
    fn from(e: tandem_model::ModelError) -> Self {
        ServeError::Usage(e.to_string())
    }
}
