//! `tandem model digest DIR`: prints the `st256` weights digest syncs carry (equal to what the
//! file contract computes, the same for a copy), and a damaged file is one error line.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::rl::*;
use tandem_plugin_api::files::digest::digest_dir;

#[test]
fn the_digest_of_a_model_dir_is_printed_and_a_damaged_file_is_one_line() {
    let t = Scratch::new();
    let model = t.dir.join("model");
    let out = t.tandem(&["model", "digest", model.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let printed = out.stdout_text().trim().to_string();
    assert_eq!(printed, digest_dir(&model).unwrap());
    assert!(printed.starts_with("st256:"), "{printed}");

    // A truncated weights file: refused, one line naming the file, nothing on stdout.
    let file = model.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
    let out = t.tandem(&["model", "digest", model.to_str().unwrap()]);
    assert!(!out.status.success());
    let lines = crate::common::error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("model.safetensors") && lines[0].contains("truncated"),
        "{}",
        lines[0]
    );
    assert!(out.stdout_text().is_empty());
}
