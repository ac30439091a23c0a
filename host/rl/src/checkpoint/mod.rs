//! Checkpoints of a run and `--resume`.
//!
//! `save` asks the trainer to write `<run_dir>/checkpoints/.step-NNNNNN.tmp`, adds
//! [`LOOP_STATE`] (step, data position, weight version), [`STEP_METRICS`] and the companion
//! files of the job's model (tokenizer, generation config, chat template:
//! `tandem_model::companion`), then, last, the manifest [`MANIFEST`] of every other file
//! (size and xxh3-64: `manifest.rs`), fsyncs, and renames the directory to `step-NNNNNN`: a
//! directory with that name is complete by construction, and Hugging Face tools, vLLM and
//! `tandem generate` load it as it is (a LoRA run's checkpoint is a PEFT adapter directory
//! with the same companions). [`newest_valid`] finds the newest checkpoint whose files match
//! its manifest, naming each newer one it skips and why; half-written `.tmp` directories are
//! ignored (and removed on resume).

use crate::error::RlError;
use crate::metrics::StepMetrics;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tandem_runtime::launch::RemoteTrainer;

mod manifest;
pub use manifest::MANIFEST;

/// File inside a checkpoint with the loop's position.
pub const LOOP_STATE: &str = "tandem_loop_state.json";

/// File inside a checkpoint with what its step measured up to the save (rollout and train
/// figures): a run killed after the save but before the step's metrics line was written
/// gets the line back from here on `--resume`.
pub const STEP_METRICS: &str = "tandem_step_metrics.json";

/// Where the loop was when a checkpoint was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopState {
    /// Last completed RL step.
    pub step: u32,
    /// Index of the next problem of the task stream.
    pub data_position: u64,
    /// Trainer's weight version.
    pub weight_version: u64,
}

/// The checkpoints directory of a run.
pub fn dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Writes a complete checkpoint of `state` (companion files from `source_model`, the job's
/// model; `also` writes what else the run trains into it, e.g. PPO's critic, before the
/// manifest covers it); returns its directory.
pub fn save(
    run_dir: &Path,
    trainer: &RemoteTrainer,
    source_model: &Path,
    state: &LoopState,
    metrics: &StepMetrics,
    also: &mut dyn FnMut(&Path) -> Result<(), RlError>,
) -> Result<PathBuf, RlError> {
    let root = dir(run_dir);
    std::fs::create_dir_all(&root).map_err(RlError::io(format!("creating {}", root.display())))?;
    let name = format!("step-{:06}", state.step);
    let tmp = root.join(format!(".{name}.tmp"));
    let done = root.join(&name);
    let _ = std::fs::remove_dir_all(&tmp);
    trainer.save_checkpoint(&tmp.display().to_string())?;
    also(&tmp)?;
    let text = serde_json::to_string_pretty(state)
        .map_err(|e| RlError::failed(format!("encoding the loop state: {e}")))?;
    let path = tmp.join(LOOP_STATE);
    std::fs::write(&path, text).map_err(RlError::io(format!("writing {}", path.display())))?;
    let path = tmp.join(STEP_METRICS);
    let text = serde_json::to_string(metrics)
        .map_err(|e| RlError::failed(format!("encoding the step metrics: {e}")))?;
    std::fs::write(&path, text).map_err(RlError::io(format!("writing {}", path.display())))?;
    tandem_model::companion::complete(source_model, &tmp)?;
    // Last: the manifest covers every file above.
    manifest::write(&tmp)?;
    sync_tree(&tmp)?;
    if done.exists() {
        // The same step saved again after a resume: replace it as a whole.
        std::fs::remove_dir_all(&done)
            .map_err(RlError::io(format!("replacing {}", done.display())))?;
    }
    std::fs::rename(&tmp, &done).map_err(RlError::io(format!("publishing {}", done.display())))?;
    sync_dir(&root)?;
    Ok(done)
}

fn sync_dir(dir: &Path) -> Result<(), RlError> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(RlError::io(format!("syncing {}", dir.display())))
}

fn sync_tree(dir: &Path) -> Result<(), RlError> {
    let entries =
        std::fs::read_dir(dir).map_err(RlError::io(format!("reading {}", dir.display())))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sync_tree(&p)?;
        } else {
            std::fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(RlError::io(format!("syncing {}", p.display())))?;
        }
    }
    sync_dir(dir)
}

/// The checkpoint a run resumes from ([`newest_valid`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// Its directory.
    pub dir: PathBuf,
    /// Its loop state.
    pub state: LoopState,
    /// The newer checkpoints that failed their checks, newest first.
    pub skipped: Vec<Skipped>,
}

/// A checkpoint [`newest_valid`] passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its directory.
    pub dir: PathBuf,
    /// Why it cannot be resumed from (one line).
    pub reason: String,
}

/// The newest valid checkpoint of a run: the complete ones (`step-N` directories) are checked
/// newest to oldest — every file its manifest lists is there with its size and digest, and
/// its loop state parses — and the first that passes is returned with the newer ones skipped.
/// A checkpoint written before checkpoints carried a manifest (no [`MANIFEST`]) counts as
/// valid if its loop state parses. `Ok(None)`: the run has no complete checkpoint; an error
/// (usage, one line naming each checkpoint and why) when it has some and none is valid.
pub fn newest_valid(run_dir: &Path) -> Result<Option<Resume>, RlError> {
    let mut skipped = Vec::new();
    for dir in complete_newest_first(run_dir) {
        match check(&dir) {
            Ok(state) => {
                return Ok(Some(Resume {
                    dir,
                    state,
                    skipped,
                }));
            }
            Err(reason) => skipped.push(Skipped { dir, reason }),
        }
    }
    if skipped.is_empty() {
        return Ok(None);
    }
    let why: Vec<String> = skipped
        .iter()
        .map(|s| format!("{}: {}", s.dir.display(), s.reason))
        .collect();
    Err(RlError::usage(format!(
        "--resume {}: no checkpoint of the run is valid ({})",
        run_dir.display(),
        why.join("; ")
    ))
    .with_help(
        "nothing was changed; put back an intact copy of a checkpoint directory, or start \
         the job again with --output-dir NEW_DIR",
    ))
}

/// The `step-N` directories of a run, highest N first.
fn complete_newest_first(run_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir(run_dir)) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The loop state of a checkpoint that passes its checks, else why it does not.
fn check(dir: &Path) -> Result<LoopState, String> {
    let manifest = manifest::verify(dir)?;
    let text = std::fs::read_to_string(dir.join(LOOP_STATE)).map_err(|e| {
        let what = if manifest { "" } else { " (and no manifest)" };
        format!("{LOOP_STATE} cannot be read{what}: {e}")
    })?;
    serde_json::from_str(&text).map_err(|e| format!("{LOOP_STATE} is not a loop state ({e})"))
}

/// The newest complete checkpoint of a run and its loop state, unverified (resuming uses
/// [`newest_valid`]).
pub fn newest(run_dir: &Path) -> Result<Option<(PathBuf, LoopState)>, RlError> {
    let root = dir(run_dir);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(None);
    };
    let mut best: Option<(PathBuf, LoopState)> = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("step-") {
            continue;
        }
        let path = e.path().join(LOOP_STATE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let state: LoopState = serde_json::from_str(&text).map_err(|e| {
            RlError::usage(format!("{}: not a loop state ({e})", path.display()))
                .with_help("delete that checkpoint directory to resume from an older one")
        })?;
        if best.as_ref().is_none_or(|(_, b)| state.step > b.step) {
            best = Some((e.path(), state));
        }
    }
    Ok(best)
}

/// Removes half-written checkpoint directories left by a run that was killed.
pub fn clean_partial(run_dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir(run_dir)) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// The step metrics saved with a checkpoint, if any.
pub fn step_metrics(checkpoint: &Path) -> Option<StepMetrics> {
    let text = std::fs::read_to_string(checkpoint.join(STEP_METRICS)).ok()?;
    serde_json::from_str(&text).ok()
}
