//! The exported versions under a run directory: `weights/v<N>` (full checkpoints) and
//! `adapters/v<N>` (LoRA adapters), each a complete directory an engine loads.
//!
//! An export of version `v` goes in three steps: [`prepare_stage`] (the stage directory
//! `.v<N>.stage`, and the parent trimmed so that it keeps one older version), the trainer's
//! writes into the stage, then [`publish`] (one rename; durable exports fsync every file and
//! the directory before it and the parent after it, so a crash leaves the old or the new
//! directory, never a torn one). Invariant: after a publish the parent holds `v<N>` and at
//! most one older version — the one engines served before, which an engine that fails to
//! switch keeps serving.

use std::path::{Path, PathBuf};

use super::FilesError;

/// Which kind of export a version directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionKind {
    /// A full checkpoint (config, safetensors, state file): `weights/`.
    Weights,
    /// A PEFT adapter (config, safetensors, state file): `adapters/`.
    Adapters,
}

impl VersionKind {
    /// The directory under the run directory that holds this kind's versions.
    pub fn dir_name(self) -> &'static str {
        match self {
            VersionKind::Weights => "weights",
            VersionKind::Adapters => "adapters",
        }
    }
}

/// How many versions a parent keeps after a publish: the new one and the one before.
pub const KEEP: usize = 2;

/// `<run_dir>/weights` or `<run_dir>/adapters`.
pub fn versions_parent(run_dir: &Path, kind: VersionKind) -> PathBuf {
    run_dir.join(kind.dir_name())
}

/// The published directory of version `v` under `parent`: `v<N>`.
pub fn version_dir(parent: &Path, v: u64) -> PathBuf {
    parent.join(format!("v{v}"))
}

/// The stage directory of version `v` under `parent`: `.v<N>.stage`.
pub fn stage_dir(parent: &Path, v: u64) -> PathBuf {
    parent.join(format!(".v{v}.stage"))
}

/// The published versions under `parent`, ascending (none when it does not exist).
pub fn versions(parent: &Path) -> Result<Vec<u64>, FilesError> {
    let rd = match std::fs::read_dir(parent) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FilesError::io(format!("reading {}", parent.display()), e)),
    };
    let mut found: Vec<u64> = rd
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            name.to_str()?.strip_prefix('v')?.parse().ok()
        })
        .collect();
    found.sort_unstable();
    Ok(found)
}

/// Prepares the stage directory of version `v` under `parent` (created if missing) and
/// returns it. Every version but the newest one below `v` is removed, and so is any other
/// stage directory, except that with `recycle` one of them becomes the stage: a stage left by
/// an unfinished export of `v`, else `v<N>` itself (a repeated export), else the oldest
/// removable version — a writer that overwrites files in place then reuses their page-cache
/// pages instead of allocating new ones (fresh pages cost more than the copy in a VM). Without
/// `recycle` the stage is returned empty (not created). The stage only becomes `v<N>` through
/// [`publish`], once every file in it is rewritten.
pub fn prepare_stage(parent: &Path, v: u64, recycle: bool) -> Result<PathBuf, FilesError> {
    std::fs::create_dir_all(parent)
        .map_err(|e| FilesError::io(format!("creating {}", parent.display()), e))?;
    let stage = stage_dir(parent, v);
    let mut found = versions(parent)?;
    let keep = found.iter().rev().find(|&&k| k < v).copied();
    found.retain(|&k| Some(k) != keep);
    // The directory to recycle as the stage, in order of preference.
    let reuse = if !recycle || stage.exists() {
        None
    } else if found.contains(&v) {
        Some(v)
    } else {
        found.first().copied()
    };
    if let Some(k) = reuse {
        let from = version_dir(parent, k);
        std::fs::rename(&from, &stage).map_err(|e| {
            FilesError::io(
                format!("renaming {} to {}", from.display(), stage.display()),
                e,
            )
        })?;
    }
    for k in found.into_iter().filter(|&k| Some(k) != reuse) {
        remove_dir(&version_dir(parent, k))?;
    }
    remove_other_stages(parent, &stage)?;
    if !recycle {
        remove_dir(&stage)?;
    }
    Ok(stage)
}

/// Removes every `.v<N>.stage` directory of `parent` other than `keep` (left by exports that
/// did not finish).
fn remove_other_stages(parent: &Path, keep: &Path) -> Result<(), FilesError> {
    let rd = std::fs::read_dir(parent)
        .map_err(|e| FilesError::io(format!("reading {}", parent.display()), e))?;
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(".v") && name.ends_with(".stage") && entry.path() != keep {
            remove_dir(&entry.path())?;
        }
    }
    Ok(())
}

fn remove_dir(dir: &Path) -> Result<(), FilesError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(FilesError::io(format!("removing {}", dir.display()), e))
        }
        _ => Ok(()),
    }
}

/// Makes the finished `stage` the version directory `target` (replacing one of that name):
/// with `durable`, every file and the directory are fsynced before the rename and the parent
/// after it.
pub fn publish(stage: &Path, target: &Path, durable: bool) -> Result<(), FilesError> {
    if durable {
        let rd = std::fs::read_dir(stage)
            .map_err(|e| FilesError::io(format!("reading {}", stage.display()), e))?;
        for entry in rd {
            let path = entry
                .map_err(|e| FilesError::io(format!("reading {}", stage.display()), e))?
                .path();
            fsync(&path)?;
        }
        fsync(stage)?;
    }
    remove_dir(target)?;
    std::fs::rename(stage, target).map_err(|e| {
        FilesError::io(
            format!("renaming {} to {}", stage.display(), target.display()),
            e,
        )
    })?;
    if durable && let Some(parent) = target.parent() {
        fsync(parent)?;
    }
    Ok(())
}

fn fsync(path: &Path) -> Result<(), FilesError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| FilesError::io(format!("fsync {}", path.display()), e))
}

/// Removes every entry of `dir` (a recycled stage) not named in `names`: what an export
/// writes is all the new version holds.
pub fn keep_only(dir: &Path, names: &[&str]) -> Result<(), FilesError> {
    let what = || format!("cleaning {}", dir.display());
    let rd = std::fs::read_dir(dir).map_err(|e| FilesError::io(what(), e))?;
    for entry in rd {
        let entry = entry.map_err(|e| FilesError::io(what(), e))?;
        if names.iter().any(|n| entry.file_name() == **n) {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| FilesError::io(what(), e))?;
        let r = if kind.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        r.map_err(|e| FilesError::io(format!("removing {}", path.display()), e))?;
    }
    Ok(())
}
