//! The crate's one error type. Every variant says what went wrong, on which region or tag, and
//! how to fix it, so the host can print it as one line.

use std::time::Duration;

/// Everything that can go wrong in the memory layer.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// A region of zero bytes was requested.
    #[error("cannot allocate a zero-byte region for tag `{tag}`: request at least one element")]
    ZeroSize {
        /// Tag of the request.
        tag: String,
    },
    /// The size is not a whole number of elements.
    #[error(
        "region size {size} bytes for tag `{tag}` is not a multiple of the {dtype} element size \
         ({elem} bytes): round the size to whole elements"
    )]
    PartialElement {
        /// Tag of the request.
        tag: String,
        /// Requested size in bytes.
        size: usize,
        /// Element type name.
        dtype: String,
        /// Element size in bytes.
        elem: usize,
    },
    /// The allocation (or resume) would exceed the process's byte cap.
    #[error(
        "allocating {requested} bytes for tag `{tag}` exceeds this process's memory budget: \
         {remaining} of {cap} bytes remain ({resident} resident); pause or free regions, or raise \
         the process's memory fraction"
    )]
    OverBudget {
        /// Tag of the request.
        tag: String,
        /// Bytes asked for.
        requested: u64,
        /// Bytes still available under the cap.
        remaining: u64,
        /// The cap.
        cap: u64,
        /// Bytes resident now.
        resident: u64,
    },
    /// `pause` on a region that is already paused.
    #[error("cannot pause region {id} (tag `{tag}`): it is already paused; resume it first")]
    AlreadyPaused {
        /// Region id.
        id: u64,
        /// Region tag.
        tag: String,
    },
    /// `resume` on a region that is resident.
    #[error("cannot resume region {id} (tag `{tag}`): it is resident, not paused; pause it first")]
    NotPaused {
        /// Region id.
        id: u64,
        /// Region tag.
        tag: String,
    },
    /// A `keep_resident` guard forbids pausing this tag.
    #[error(
        "cannot pause tag `{tag}`: {guards} keep_resident guard(s) on it are held; drop them first \
         or call pause_wait with a timeout"
    )]
    KeptResident {
        /// The guarded tag.
        tag: String,
        /// Number of live guards.
        guards: usize,
    },
    /// `pause_wait` gave up.
    #[error("timed out after {waited:?} waiting for keep_resident guard(s) on tag `{tag}` to drop")]
    GuardTimeout {
        /// The guarded tag.
        tag: String,
        /// How long it waited.
        waited: Duration,
    },
    /// A view into the region is alive, so its contents cannot be moved now.
    #[error(
        "region {id} (tag `{tag}`) is borrowed by a view; drop the view before pausing, resuming, \
         snapshotting or restoring it"
    )]
    Borrowed {
        /// Region id.
        id: u64,
        /// Region tag.
        tag: String,
    },
    /// The region is paused, so its contents are not accessible.
    #[error("region {id} (tag `{tag}`) is paused; resume it before {action}")]
    Paused {
        /// Region id.
        id: u64,
        /// Region tag.
        tag: String,
        /// What was attempted.
        action: &'static str,
    },
    /// No snapshot by that name.
    #[error("unknown snapshot `{name}`; existing snapshots: [{known}]")]
    UnknownSnapshot {
        /// Requested name.
        name: String,
        /// Comma-separated list of existing names.
        known: String,
    },
    /// A snapshot refers to a region that no longer exists.
    #[error(
        "snapshot `{name}` holds region {id} (tag `{tag}`), which has been freed; drop the \
         snapshot and take a new one"
    )]
    StaleSnapshot {
        /// Snapshot name.
        name: String,
        /// Freed region id.
        id: u64,
        /// Its tag.
        tag: String,
    },
    /// A tag, dtype or policy name could not be parsed.
    #[error("invalid {what} `{value}`: {help}")]
    Parse {
        /// What was being parsed (tag, dtype, backup policy).
        what: &'static str,
        /// The offending text.
        value: String,
        /// What is accepted.
        help: String,
    },
    /// A caller-supplied argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Sys {
        /// The operation, e.g. `memfd_create`.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A `/proc` file could not be read or parsed.
    #[error("could not read `{field}` from {path}: {reason}")]
    Proc {
        /// File path.
        path: &'static str,
        /// Field name.
        field: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// A region key could not be resolved to the owner's memory.
    #[error("cannot attach region `{key}`: {reason}")]
    Attach {
        /// The key.
        key: String,
        /// What went wrong.
        reason: String,
    },
    /// The CUDA backend failed or is unavailable.
    #[error("CUDA: {0}")]
    Cuda(String),
}

impl MemoryError {
    /// Wraps an errno from nix as a [`MemoryError::Sys`].
    pub(crate) fn errno(op: &'static str, e: nix::errno::Errno) -> Self {
        MemoryError::Sys {
            op,
            source: std::io::Error::from(e),
        }
    }

    /// Wraps the current `errno` as a [`MemoryError::Sys`].
    pub(crate) fn last_os(op: &'static str) -> Self {
        MemoryError::Sys {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Short alias used across the crate.
pub type Result<T, E = MemoryError> = std::result::Result<T, E>;
