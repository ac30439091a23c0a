//! The crate's one error type. Every variant names what failed, where (peer rank and address,
//! store address, key) and how to fix it, so a caller can print it as one line.

use std::time::Duration;

/// Everything that can go wrong in the transport layer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A peer did not answer within the configured timeout.
    #[error(
        "timed out after {timeout:?} during {what} with peer rank {rank} ({addr}); the peer is \
         alive but did not post the matching operation, or never arrived: check its log, or \
         raise the transport timeout"
    )]
    Timeout {
        /// Peer rank (in the world).
        rank: usize,
        /// Peer address (shm socket name, tcp address, ...).
        addr: String,
        /// Operation that timed out.
        what: String,
        /// The timeout that elapsed.
        timeout: Duration,
    },
    /// A peer process exited or closed its end while an operation was in flight.
    #[error(
        "peer rank {rank} ({addr}) died or closed the connection during {what}; see that rank's \
         log for the cause"
    )]
    PeerDied {
        /// Peer rank (in the world).
        rank: usize,
        /// Peer address.
        addr: String,
        /// Operation in flight.
        what: String,
    },
    /// An earlier error left the link to a peer in an unknown state (e.g. a frame cut short).
    #[error(
        "the link to rank {rank} ({addr}) is unusable after an earlier error ({cause}); \
         rebuild the communicator"
    )]
    Broken {
        /// Peer rank (in the world).
        rank: usize,
        /// Peer address.
        addr: String,
        /// The first error.
        cause: String,
    },
    /// Sender and receiver disagree on the size of a message.
    #[error(
        "size mismatch on message from rank {src} to rank {dst} (tag {tag}): the sender sent \
         {sent} bytes but the receiver posted a buffer of {expected} bytes; post send and recv \
         with equal sizes"
    )]
    SizeMismatch {
        /// Sending rank (world).
        src: usize,
        /// Receiving rank (world).
        dst: usize,
        /// Message tag.
        tag: u32,
        /// Bytes sent.
        sent: u64,
        /// Bytes the receiver expected.
        expected: u64,
    },
    /// The caller passed an invalid argument (rank out of range, bad buffer size, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The rendezvous store failed or answered with an error.
    #[error("rendezvous store {addr}: {msg}")]
    Store {
        /// Store address.
        addr: String,
        /// What went wrong and how to fix it.
        msg: String,
    },
    /// Waiting for keys in the rendezvous store timed out.
    #[error(
        "rendezvous store {addr}: timed out after {timeout:?} waiting for keys {missing:?}; the \
         ranks that publish them never arrived: check that every rank was started and reaches \
         the same store"
    )]
    StoreTimeout {
        /// Store address.
        addr: String,
        /// Keys still missing.
        missing: Vec<String>,
        /// The timeout that elapsed.
        timeout: Duration,
    },
    /// The requested backend cannot be used here (not compiled in, library missing, placement).
    #[error("{0}")]
    Unsupported(String),
    /// CUDA or NCCL reported an error.
    #[error("CUDA/NCCL error with peer rank {rank}: {msg}")]
    Device {
        /// Peer rank (in the world).
        rank: usize,
        /// The library's error.
        msg: String,
    },
    /// An I/O error outside a peer exchange (binding a socket, creating a memfd, ...).
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A peer sent bytes that do not follow the wire protocol.
    #[error("protocol error with {peer}: {msg}; are both sides running the same tandem version?")]
    Protocol {
        /// Who sent the bad bytes.
        peer: String,
        /// What was wrong.
        msg: String,
    },
}

/// Shorthand used across the crate.
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

impl TransportError {
    /// Wraps an I/O error with what we were doing.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TransportError::Io {
            context: context.into(),
            source,
        }
    }
}
