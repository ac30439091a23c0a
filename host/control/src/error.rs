//! Errors of the control plane.
//!
//! Every error names the peer (role, rank, pid and log file once known) and the call; a worker
//! that died is reported with its exit status and the tail of its log, so the first line of
//! the error says what happened and the tail shows why.

use std::time::Duration;
use tandem_plugin_api::PluginError;

/// Why a control-plane operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// The component answered the call with an error; the worker is fine.
    #[error("{peer}: `{op}`: {error}")]
    Remote {
        /// The worker.
        peer: String,
        /// The call.
        op: &'static str,
        /// The plugin's error, as it returned it.
        error: PluginError,
    },
    /// No answer within the call's timeout; the worker was still connected.
    #[error(
        "{peer}: no answer to `{op}` within {:.1} s; the worker is still running but busy or stuck",
        after.as_secs_f64()
    )]
    Timeout {
        /// The worker.
        peer: String,
        /// The call.
        op: &'static str,
        /// The timeout that passed.
        after: Duration,
    },
    /// The worker is gone (died, closed the connection, or was shut down).
    #[error("{peer}: `{op}` failed: {reason}")]
    Lost {
        /// The worker.
        peer: String,
        /// The call.
        op: &'static str,
        /// What happened to the worker (exit status and log tail when it died).
        reason: String,
    },
    /// The worker cannot reach the controller.
    #[error("control plane: connecting to the controller at {addr}: {message}")]
    Unreachable {
        /// The controller's address.
        addr: String,
        /// The connection error.
        message: String,
    },
    /// The peer sent something that is not the protocol.
    #[error("{peer}: control-plane protocol error: {message}")]
    Protocol {
        /// The peer.
        peer: String,
        /// What was wrong.
        message: String,
    },
    /// The controller refused this worker's hello.
    #[error("the controller at {addr} rejected this worker: {reason}")]
    Rejected {
        /// The controller's address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// A socket operation failed.
    #[error("{context}: {message}")]
    Io {
        /// What was being done, including the peer.
        context: String,
        /// The I/O error.
        message: String,
    },
}

impl ControlError {
    /// How to fix it, when there is something to say.
    pub fn help(&self) -> Option<&'static str> {
        match self {
            ControlError::Timeout { .. } => Some("raise the call timeout or read the worker's log"),
            ControlError::Unreachable { .. } => Some("is `tandem run` still running?"),
            ControlError::Rejected { .. } => Some(
                "workers are started by `tandem run`; pass the run's token in the variable named by --token-env",
            ),
            _ => None,
        }
    }

    /// An [`ControlError::Io`] from any displayable error.
    pub fn io(context: impl Into<String>, err: impl std::fmt::Display) -> Self {
        ControlError::Io {
            context: context.into(),
            message: err.to_string(),
        }
    }
}
