//! `examples/out-of-tree-env` (plugin `example-countdown`, environment `countdown`) is a
//! separate crate depending on `tandem-plugin-api` by path only: it builds on its own, `tandem
//! plugins --plugin-dir` lists its environment, and its own `tests/conformance.rs` passes the
//! `environment` group of `tandem-conformance`.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::{cargo, plugin_dir, run, stderr, stdout, tandem, workspace_root};
use std::path::PathBuf;
use std::sync::OnceLock;

const LIB: &str = "libtandem_example_countdown.so";
const MANIFEST: &str = "examples/out-of-tree-env/Cargo.toml";

/// Builds the example once per test process (into the scratch target dir the other
/// out-of-tree tests use) and returns the library.
fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = workspace_root();
            let target = root.join("target/out-of-tree");
            let out = cargo()
                .args(["build", "--offline", "-q", "--manifest-path"])
                .arg(root.join(MANIFEST))
                .env("CARGO_TARGET_DIR", &target)
                .output()
                .expect("run cargo");
            assert!(
                out.status.success(),
                "building examples/out-of-tree-env failed:\n{}",
                stderr(&out)
            );
            target.join("debug").join(LIB)
        })
        .clone()
}

#[test]
fn the_countdown_environment_builds_out_of_tree_and_is_listed() {
    let dir = plugin_dir(&[(&library(), LIB)]);
    let out = run(tandem().args(["plugins", "--plugin-dir"]).arg(dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let level = format!(
        "example-countdown 0.1.0 (API level {}",
        tandem_plugin_api::API_LEVEL
    );
    assert!(text.contains(&level), "{text}");
    assert!(
        text.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.starts_with(&["environment", "countdown"])
        }),
        "a line `environment countdown …` in:\n{text}"
    );
}

#[test]
fn the_countdown_environment_passes_the_conformance_group() {
    let root = workspace_root();
    let out = cargo()
        .args([
            "test",
            "--offline",
            "-q",
            "--test",
            "conformance",
            "--manifest-path",
        ])
        .arg(root.join(MANIFEST))
        .env("CARGO_TARGET_DIR", root.join("target/out-of-tree"))
        .output()
        .expect("run cargo");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("9 passed; 0 failed"), "{text}");
}
