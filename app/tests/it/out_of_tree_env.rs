//! `examples/out-of-tree-env` (plugin `example-countdown`, environment `countdown`) is a
//! separate crate depending on `tandem-plugin-api` by path only: it builds on its own, `tandem
//! plugins --plugin-dir` lists its environment, and its own `tests/conformance.rs` passes the
//! `environment` group of `tandem-conformance`, and `tandem run` trains on it.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::{
    build_example, cargo, plugin_dir, run, stderr, stdout, tandem, workspace_root,
};
use std::path::PathBuf;
use std::sync::OnceLock;

const LIB: &str = "libtandem_example_countdown.so";
const MANIFEST: &str = "examples/out-of-tree-env/Cargo.toml";

/// Builds the example once per test process (into the scratch target dir the other
/// out-of-tree tests use) and returns the library.
fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_example(MANIFEST, LIB)).clone()
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

/// `tandem run` trains on the out-of-tree environment (loaded from `--plugin-dir`): two
/// steps, its reward components and held-out accuracy in `metrics.jsonl`.
#[test]
fn the_countdown_environment_runs_in_tandem_run() {
    use crate::common::rl::{JobOpts, OutputText, Scratch};
    let dir = plugin_dir(&[(&library(), LIB)]);
    let t = Scratch::new();
    let o = JobOpts {
        steps: 2,
        prompts: 4,
        group: 2,
        max_tokens: 8,
        task_options: "numbers = 3\n".into(),
        extra_sections: "[eval]\nevery = 2\nproblems = 4\n".into(),
        ..JobOpts::default()
    };
    let job = t.job(&o);
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace(
            "[task]\nkind = \"arithmetic\"",
            "[environment]\nplugin = \"countdown\"",
        )
        .replace("[task.options]", "[environment.options]")
        .replace("max_seq_len = 64", "max_seq_len = 256");
    std::fs::write(&job, text).unwrap();
    let out = t.run(&job, &["--plugin-dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let metrics = std::fs::read_to_string(t.dir.join("run/metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    let components = last["reward_components"].as_object().unwrap();
    assert!(
        components.contains_key("valid_expression") && components.contains_key("correct"),
        "{last}"
    );
    assert_eq!(last["eval_problems"], 4, "{last}");
}
