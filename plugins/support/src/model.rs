//! What a server plugin reads of the model directory it will serve, without loading it: the
//! longest sequence its position table holds (what a server sizes its context by default).

use std::path::Path;

/// `max_position_embeddings` of the model's `config.json`, when the directory holds one
/// that says.
pub fn max_positions(model: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(model.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    config["max_position_embeddings"]
        .as_u64()
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_position_table_or_says_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(max_positions(dir.path()), None);
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"max_position_embeddings": 2048}"#,
        )
        .unwrap();
        assert_eq!(max_positions(dir.path()), Some(2048));
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        assert_eq!(max_positions(dir.path()), None);
    }
}
