//! Fixtures for a server plugin's own tests of what its options make the engine do: a model
//! directory that has only a position table.

use std::path::PathBuf;

/// A model directory (under the system temp dir, one per process and `positions`) whose
/// `config.json` holds only `max_position_embeddings = positions`.
pub fn model_with_positions(positions: u32) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "tandem-describe-{}-{positions}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let config = format!(r#"{{"max_position_embeddings": {positions}}}"#);
    std::fs::write(dir.join("config.json"), config)?;
    Ok(dir)
}
