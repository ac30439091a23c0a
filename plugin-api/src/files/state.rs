//! The trainer state file, `tandem_trainer_state.json`, written into every checkpoint and
//! every exported version: the weight version the files hold and the optimizer step, plus
//! whatever else a trainer records (kept as it is).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::FilesError;

/// The state file's name inside a checkpoint or version directory.
pub const STATE_FILE: &str = "tandem_trainer_state.json";

/// The state file's contents.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// The weight version the directory's weights are.
    pub weight_version: u64,
    /// Optimizer steps taken (AdamW's bias correction resumes from it).
    #[serde(default)]
    pub adam_step: u64,
    /// Other fields a trainer records (the native trainer: `value_head`).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl TrainerState {
    /// A state with `weight_version` and `adam_step` and nothing else.
    pub fn new(weight_version: u64, adam_step: u64) -> TrainerState {
        TrainerState {
            weight_version,
            adam_step,
            extra: serde_json::Map::new(),
        }
    }
}

/// The state file of `dir`: `None` when there is none, an error when it is not a state file.
pub fn read_state(dir: &Path) -> Result<Option<TrainerState>, FilesError> {
    let path = dir.join(STATE_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FilesError::io(format!("reading {}", path.display()), e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| FilesError::corrupt(&path, format!("not a trainer state file: {e}")))
}

/// The weight version recorded in `dir`'s state file, if it has a readable one.
pub fn saved_version(dir: &Path) -> Option<u64> {
    read_state(dir).ok().flatten().map(|s| s.weight_version)
}

/// Writes `state` as `dir`'s state file (over an older one).
pub fn write_state(dir: &Path, state: &TrainerState) -> Result<(), FilesError> {
    let path = dir.join(STATE_FILE);
    let text = serde_json::to_string(state).map_err(|e| {
        FilesError::io(
            format!("encoding {}", path.display()),
            std::io::Error::other(e),
        )
    })?;
    std::fs::write(&path, text)
        .map_err(|e| FilesError::io(format!("writing {}", path.display()), e))
}
