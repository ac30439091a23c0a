//! The tracking crate's error: a file of the run directory, or a tracker that refused or did
//! not answer (the caller turns the latter into a warning, never a failed run).

/// Errors of tracking.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    /// A file of the run directory or an event file.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// A tracker refused a call or could not be reached.
    #[error("{tracker}: {text}")]
    Tracker {
        /// `tensorboard`, `wandb` or `mlflow`.
        tracker: &'static str,
        /// What went wrong, in one line.
        text: String,
    },
}

impl TrackError {
    /// I/O failure while doing `context`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| TrackError::Io { context, source }
    }

    /// A tracker's failure.
    pub fn tracker(tracker: &'static str, text: impl Into<String>) -> Self {
        TrackError::Tracker {
            tracker,
            text: text.into(),
        }
    }
}
