//! The run-directory file contract between trainers and engines: one implementation every
//! plugin uses, with a Python twin (`tandem_torchrun.files`, used by the torch trainers) that a
//! test checks equal to it on the same files.
//!
//! - [`state`]: the trainer state file `tandem_trainer_state.json` (weight version, optimizer
//!   step) in every checkpoint and export.
//! - [`versions`]: the `weights/v<N>` and `adapters/v<N>` layout under the run directory. An
//!   export is written into a stage directory and published by one rename; the parent keeps
//!   the two newest versions (the one exported, the one engines served before).
//! - [`digest`]: the digest of a set of named tensors, computed the same from the tensors a
//!   trainer writes and from the files an engine loads, however the tensors are split into
//!   files or ordered in them.
//!
//! Pure Rust and no ABI type: plugins call it inside their own process.

pub mod digest;
pub mod safetensors;
pub mod state;
pub mod versions;

#[cfg(test)]
mod tests;

use std::path::Path;

use crate::error::{ErrorCode, PluginError};

/// A file-contract failure.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// Reading, writing, renaming or syncing a path failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not what the contract says it is (a bad safetensors header, a truncated
    /// tensor, a digest that does not match).
    #[error("{path}: {detail}")]
    Corrupt {
        /// The file or directory.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
}

impl FilesError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> FilesError {
        FilesError::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: &Path, detail: impl Into<String>) -> FilesError {
        FilesError::Corrupt {
            path: path.display().to_string(),
            detail: detail.into(),
        }
    }
}

impl From<FilesError> for PluginError {
    fn from(e: FilesError) -> PluginError {
        match e {
            FilesError::Io { .. } => PluginError::io(e.to_string()),
            FilesError::Corrupt { .. } => PluginError::new(ErrorCode::Corrupt, e.to_string()),
        }
    }
}

/// Bytes of the regular files directly in `dir` (what an engine reads of an exported
/// version); 0 when `dir` cannot be read.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
