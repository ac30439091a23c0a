//! A model directory's special token ids: BOS from `config.json`; EOS (the stop ids of
//! generation) from `generation_config.json` when it names them (chat models list their
//! end-of-turn token there), else from `config.json`. `eos_token_id` is one id or a list.

use std::path::Path;

use crate::error::{ModelError, Result};

/// BOS id and EOS ids of the model directory `model` (see the module doc). A missing or
/// malformed `config.json`, or a malformed `generation_config.json`, is
/// [`ModelError::Invalid`] naming the file.
pub fn special_ids(model: &Path) -> Result<(Option<u32>, Vec<u32>)> {
    let config = read_json(&model.join("config.json"))?;
    let generation_path = model.join("generation_config.json");
    let generation = if generation_path.is_file() {
        read_json(&generation_path)?
    } else {
        serde_json::Value::Null
    };
    let bos = ids(&config, "bos_token_id").first().copied();
    let mut eos = ids(&generation, "eos_token_id");
    if eos.is_empty() {
        eos = ids(&config, "eos_token_id");
    }
    Ok((bos, eos))
}

/// A JSON object file.
fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bad = |e: String| ModelError::invalid(path, e);
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if !v.is_object() {
        return Err(bad("not a JSON object".into()));
    }
    Ok(v)
}

/// The ids under `key`: one id or a list.
fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    match v.get(key) {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .filter_map(|x| u32::try_from(x).ok())
            .collect(),
        Some(n) => n
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .into_iter()
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::special_ids;

    fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn eos_of_the_generation_config_wins() {
        let config = ("config.json", r#"{"bos_token_id": 1, "eos_token_id": 0}"#);
        let d = dir(&[config]);
        assert_eq!(special_ids(d.path()).unwrap(), (Some(1), vec![0]));
        let d = dir(&[
            config,
            ("generation_config.json", r#"{"eos_token_id": [2, 0]}"#),
        ]);
        assert_eq!(special_ids(d.path()).unwrap(), (Some(1), vec![2, 0]));
        // A generation config without EOS ids leaves config.json's.
        let d = dir(&[config, ("generation_config.json", r#"{"top_p": 0.9}"#)]);
        assert_eq!(special_ids(d.path()).unwrap(), (Some(1), vec![0]));
    }

    #[test]
    fn missing_or_bad_files_name_the_file() {
        let d = dir(&[]);
        let e = special_ids(d.path()).unwrap_err();
        assert!(e.to_string().contains("config.json"), "{e}");
        let d = dir(&[("config.json", "[1]")]);
        let e = special_ids(d.path()).unwrap_err();
        assert!(
            e.to_string().ends_with("config.json: not a JSON object"),
            "{e}"
        );
        let d = dir(&[("config.json", "{}"), ("generation_config.json", "{")]);
        let e = special_ids(d.path()).unwrap_err();
        assert!(e.to_string().contains("generation_config.json"), "{e}");
    }
}
