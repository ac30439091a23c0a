//! What each tracker has acknowledged: `<run dir>/tracking.json`, one entry per tracker target
//! (`tensorboard DIR`, `wandb ENTITY/PROJECT`, `mlflow URI EXPERIMENT`) with the last step it
//! took and the tracker's run id. Replaced through a temporary file and a rename after every
//! acknowledged send, so a crash leaves the old or the new state, never half of one.

use crate::error::TrackError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The state file's name in the run directory.
pub const STATE_FILE: &str = "tracking.json";

/// One tracker target's state.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SinkState {
    /// The last step it acknowledged (`None`: none yet).
    pub sent: Option<u32>,
    /// Its run id (W&B, MLflow).
    pub run_id: Option<String>,
}

/// Every target's state, by target.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TrackState {
    /// By target.
    pub targets: BTreeMap<String, SinkState>,
}

impl TrackState {
    /// The state of `run_dir` (empty when there is none; an unreadable file is an error, so a
    /// tracker's run id is never silently forgotten).
    pub fn load(run_dir: &Path) -> Result<TrackState, TrackError> {
        let path = run_dir.join(STATE_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| TrackError::Io {
                context: format!("reading {}", path.display()),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TrackState::default()),
            Err(e) => Err(TrackError::io(format!("reading {}", path.display()))(e)),
        }
    }

    /// Writes the state into `run_dir`.
    pub fn save(&self, run_dir: &Path) -> Result<(), TrackError> {
        let path = run_dir.join(STATE_FILE);
        let tmp: PathBuf = run_dir.join(format!("{STATE_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        std::fs::write(&tmp, text).map_err(TrackError::io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path)
            .map_err(TrackError::io(format!("replacing {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_round_trips_and_a_corrupt_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            TrackState::load(dir.path()).ok(),
            Some(TrackState::default())
        );
        let mut s = TrackState::default();
        s.targets.insert(
            "mlflow http://x tandem".into(),
            SinkState {
                sent: Some(4),
                run_id: Some("abc".into()),
            },
        );
        s.save(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(TrackState::load(dir.path()).ok(), Some(s));
        std::fs::write(dir.path().join(STATE_FILE), "{").unwrap_or_else(|e| panic!("{e}"));
        let e = TrackState::load(dir.path()).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains(STATE_FILE)));
    }
}
