//! Companion files: what a model directory needs beside its config and weights for Hugging
//! Face tools, vLLM and `tandem generate --prompt` to load it as it is — the tokenizer
//! (fast `tokenizer.json`, its `tokenizer_config.json` and special-token files, the slow
//! tokenizers' vocabularies), `generation_config.json` and the chat template.
//!
//! Trainers write weights and `config.json` only; the host [`complete`]s every directory it
//! publishes (run checkpoints, `checkpoint` bridge outputs, warm starts, merged LoRA models)
//! from the model the run started from, never overwriting what the trainer wrote.
//! [`missing`] says what a directory still lacks.

use std::path::Path;

use crate::error::{ModelError, Result};

/// Every companion file [`complete`] copies when the source has it.
pub const COMPANION_FILES: [&str; 11] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    // Slow tokenizers: byte-level BPE vocabularies and SentencePiece models.
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tokenizer.model.v3",
];

/// What a complete model directory must hold besides its weights: `tokenizer_config.json`,
/// `generation_config.json`, and a tokenizer — `tokenizer.json`, or a slow tokenizer's
/// `tokenizer.model` or `vocab.json` + `merges.txt` (reported as `tokenizer.json`).
pub fn missing(dir: &Path) -> Vec<&'static str> {
    let has = |name: &str| dir.join(name).is_file();
    let mut lacking = Vec::new();
    let tokenizer =
        has("tokenizer.json") || has("tokenizer.model") || (has("vocab.json") && has("merges.txt"));
    if !tokenizer {
        lacking.push("tokenizer.json");
    }
    for name in ["tokenizer_config.json", "generation_config.json"] {
        if !has(name) {
            lacking.push(name);
        }
    }
    lacking
}

/// The companion files `source` has and `target` lacks.
pub fn missing_from(source: &Path, target: &Path) -> Vec<&'static str> {
    COMPANION_FILES
        .into_iter()
        .filter(|name| source.join(name).is_file() && !target.join(name).exists())
        .collect()
}

/// Copies into `target` every companion file `source` has and `target` lacks (what the
/// target already holds is never overwritten), and returns the names copied. Each file is
/// written under a temporary name and renamed, so a reader never sees half of one. Nothing
/// is fsynced: a caller publishing a durable directory syncs it as a whole.
pub fn complete(source: &Path, target: &Path) -> Result<Vec<&'static str>> {
    if !target.is_dir() {
        return Err(ModelError::invalid(target, "not a directory"));
    }
    let mut copied = Vec::new();
    for name in missing_from(source, target) {
        let from = source.join(name);
        let to = target.join(name);
        let tmp = target.join(format!(".{name}.tmp-{}", std::process::id()));
        std::fs::copy(&from, &tmp).map_err(ModelError::io(&from))?;
        if let Err(e) = std::fs::rename(&tmp, &to) {
            let _ = std::fs::remove_file(&tmp);
            return Err(ModelError::io(&to)(e));
        }
        copied.push(name);
    }
    Ok(copied)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn complete_copies_what_the_target_lacks_and_never_overwrites() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "chat_template.jinja",
            "config.json",
            "model.safetensors",
        ] {
            write(src.path(), name, &format!("source {name}"));
        }
        write(dst.path(), "config.json", "trainer config");
        write(
            dst.path(),
            "generation_config.json",
            "trainer generation config",
        );
        assert_eq!(
            missing(dst.path()),
            ["tokenizer.json", "tokenizer_config.json"]
        );
        let copied = complete(src.path(), dst.path()).unwrap();
        assert_eq!(
            copied,
            [
                "tokenizer.json",
                "tokenizer_config.json",
                "chat_template.jinja"
            ]
        );
        let read = |n: &str| std::fs::read_to_string(dst.path().join(n)).unwrap();
        assert_eq!(read("tokenizer.json"), "source tokenizer.json");
        assert_eq!(read("chat_template.jinja"), "source chat_template.jinja");
        // What the trainer wrote stays, and weights are not companions.
        assert_eq!(read("config.json"), "trainer config");
        assert_eq!(read("generation_config.json"), "trainer generation config");
        assert!(!dst.path().join("model.safetensors").exists());
        assert!(missing(dst.path()).is_empty());
        assert!(missing_from(src.path(), dst.path()).is_empty());
        // No temporary file is left behind, and a second pass copies nothing.
        let names: Vec<_> = std::fs::read_dir(dst.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
        assert!(complete(src.path(), dst.path()).unwrap().is_empty());
    }

    #[test]
    fn a_slow_tokenizer_counts_and_a_bare_dir_lacks_everything() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            missing(d.path()),
            [
                "tokenizer.json",
                "tokenizer_config.json",
                "generation_config.json"
            ]
        );
        write(d.path(), "vocab.json", "{}");
        assert_eq!(missing(d.path())[0], "tokenizer.json");
        write(d.path(), "merges.txt", "");
        assert_eq!(
            missing(d.path()),
            ["tokenizer_config.json", "generation_config.json"]
        );
    }

    #[test]
    fn a_missing_target_is_an_error_naming_it() {
        let src = tempfile::tempdir().unwrap();
        let gone = src.path().join("nope");
        let e = complete(src.path(), &gone).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
