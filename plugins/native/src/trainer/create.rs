//! The trainer's `init_preset` option: writes an init preset (config.json, model.safetensors,
//! tokenizer.json, tokenizer_config.json, generation_config.json, exactly what
//! [`init_preset`] writes) into an absent or empty model directory before the trainer loads it. The preset is written into a staging
//! directory beside the target and renamed into place, so a reader (or a second trainer racing
//! to create the same model) sees either no model or a whole one.

use std::path::{Path, PathBuf};

use tandem_native_core::buffer::VecProvider;
use tandem_native_core::init::{Preset, init_preset};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ConfigProblem, PluginError};

use super::TrainerOptions;
use crate::common::Ctx;

/// What to do about a model directory when `init_preset` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirState {
    /// `config.json` is there: load it, the options are ignored.
    Present,
    /// Absent or empty: write the preset first.
    Create,
}

/// Why a model directory cannot take an init preset.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DirRefused {
    /// Something is there, but no model.
    #[error(
        "model directory {0} is not empty and has no config.json; init_preset writes only into \
         a new or empty directory"
    )]
    NotEmpty(PathBuf),
    /// It could not be listed (a file, no permission, ...).
    #[error("model directory {0}: {1}")]
    Unreadable(PathBuf, std::io::Error),
}

const HELP: &str = "point model_path at a new or empty directory, or drop init_preset and put \
                    a Hugging Face model there";

/// The state of `dir`, or why it is refused (a file, an unreadable directory, or a non-empty
/// directory without `config.json`).
pub(crate) fn dir_state(dir: &Path) -> std::result::Result<DirState, DirRefused> {
    if dir.join("config.json").is_file() {
        return Ok(DirState::Present);
    }
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Ok(true) => Ok(DirState::Create),
        Ok(false) => Err(DirRefused::NotEmpty(dir.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DirState::Create),
        Err(e) => Err(DirRefused::Unreadable(dir.to_path_buf(), e)),
    }
}

/// The preset the options name, if any (`Err`: an unknown name, as a problem at its key).
pub(crate) fn preset_of(
    opts: &TrainerOptions,
) -> std::result::Result<Option<Preset>, ConfigProblem> {
    match &opts.init_preset {
        None => Ok(None),
        Some(name) => Preset::parse(name).map(Some).map_err(|_| {
            let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
            ConfigProblem::new("init_preset", format!("unknown preset `{name}`"))
                .with_help(format!("use one of: {}", names.join(", ")))
        }),
    }
}

/// `validate_config`'s side: the refusal [`create_if_absent`] would give for `model_path`.
pub(crate) fn dir_problem(opts: &TrainerOptions, model_path: &str) -> Option<ConfigProblem> {
    if opts.init_preset.is_none() || model_path.is_empty() {
        return None;
    }
    let refused = dir_state(Path::new(model_path)).err()?;
    Some(ConfigProblem::new("init_preset", refused.to_string()).with_help(HELP))
}

/// Writes `preset` (seeded with `seed`) into `dir` unless it already holds `config.json`.
/// Returns whether it wrote the model.
pub(crate) fn create_if_absent(dir: &Path, preset: Preset, seed: u64) -> Result<bool> {
    let what = "trainer `native` init_preset";
    match dir_state(dir) {
        Ok(DirState::Present) => return Ok(false),
        Ok(DirState::Create) => {}
        Err(refused) => {
            return Err(PluginError::invalid_input(format!("{what}: {refused}")).with_help(HELP));
        }
    }
    let stage = staging_dir(dir)?;
    let written = init_preset(preset, &stage, seed, &mut VecProvider::new()).map(drop);
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&stage);
        return Err(e).ctx(what);
    }
    // rename(2) replaces an empty directory; a non-empty one means another trainer won the race.
    match std::fs::rename(&stage, dir) {
        Ok(()) => Ok(true),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&stage);
            match dir_state(dir) {
                Ok(DirState::Present) => Ok(false),
                _ => Err(PluginError::new(
                    tandem_plugin_api::ErrorCode::Io,
                    format!("{what}: moving the new model into {}: {e}", dir.display()),
                )),
            }
        }
    }
}

/// A fresh directory name beside `dir` (same file system, so the final rename is atomic); its
/// parent is created.
fn staging_dir(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().ok_or_else(|| {
        PluginError::invalid_input(format!(
            "trainer `native` init_preset: model_path {} names no directory",
            dir.display()
        ))
    })?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| {
        PluginError::new(
            tandem_plugin_api::ErrorCode::Io,
            format!(
                "trainer `native` init_preset: creating {}: {e}",
                parent.display()
            ),
        )
    })?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let stage = format!(
        ".{}.init-{}-{nanos}",
        name.to_string_lossy(),
        std::process::id()
    );
    Ok(parent.join(stage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_state_tells_absent_empty_present_and_foreign_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("m");
        assert!(matches!(dir_state(&d), Ok(DirState::Create)));
        std::fs::create_dir(&d).unwrap();
        assert!(matches!(dir_state(&d), Ok(DirState::Create)));
        std::fs::write(d.join("notes.txt"), "x").unwrap();
        let msg = dir_state(&d).unwrap_err().to_string();
        assert!(
            msg.contains(&d.display().to_string()) && !msg.contains('\n'),
            "{msg}"
        );
        std::fs::write(d.join("config.json"), "{}").unwrap();
        assert!(matches!(dir_state(&d), Ok(DirState::Present)));
        let file = tmp.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(dir_state(&file), Err(DirRefused::Unreadable(..))));
    }

    #[test]
    fn staging_is_a_hidden_sibling() {
        let tmp = tempfile::tempdir().unwrap();
        let s = staging_dir(&tmp.path().join("a/b/model")).unwrap();
        assert_eq!(s.parent(), Some(tmp.path().join("a/b").as_path()));
        assert!(
            s.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".model.init-")
        );
        assert!(tmp.path().join("a/b").is_dir());
    }
}
