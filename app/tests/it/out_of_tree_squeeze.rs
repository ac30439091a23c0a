//! `examples/out-of-tree-squeeze` (plugin `example-squeeze`, bridge `squeeze`) is a separate
//! crate depending on `tandem-plugin-api` by path only, a bridge that transforms the stream
//! (byte shuffle + zstd, its own payload, decoded into the engines' sink): it builds on its
//! own, its unit tests and its `tests/conformance.rs` (the `bridge` group of
//! `tandem-conformance`) pass, `tandem plugins --plugin-dir` lists it, `tandem check` refuses
//! a bad option at its key, and `tandem run` syncs a native trainer and two native engines
//! through it: every sync verified, each step's metrics carrying the bridge's own figures,
//! and the sync bytes its compressed bytes, once per engine.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::rl::{JobOpts, OutputText, Scratch, steps_of};
use crate::common::{
    build_example, cargo, error_lines, plugin_dir, run, stderr, stdout, tandem, workspace_root,
};
use std::path::PathBuf;
use std::sync::OnceLock;

const LIB: &str = "libtandem_example_squeeze.so";
const MANIFEST: &str = "examples/out-of-tree-squeeze/Cargo.toml";
/// Engine ranks of the test job: a broadcast with more than one receiver.
const ENGINES: u64 = 2;

/// Builds the example once per test process (into the scratch target dir the other
/// out-of-tree tests use) and returns the library.
fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_example(MANIFEST, LIB)).clone()
}

/// A plugin directory holding only the example's library.
fn plugins() -> tempfile::TempDir {
    plugin_dir(&[(&library(), LIB)])
}

/// A job of two native engines and the native trainer over `[bridge] plugin = "squeeze"`.
fn squeeze_job(t: &Scratch, steps: u32, bridge_options: &str) -> PathBuf {
    let job = t.job(&JobOpts {
        steps,
        engines: ENGINES as u32,
        bridge: "squeeze".into(),
        bridge_options: bridge_options.into(),
        ..JobOpts::default()
    });
    let text = std::fs::read_to_string(&job).unwrap();
    let text = text.replace("mode = \"squeeze\"", "plugin = \"squeeze\"");
    std::fs::write(&job, text).unwrap();
    job
}

#[test]
fn the_squeeze_bridge_builds_out_of_tree_and_is_listed() {
    let dir = plugins();
    let out = run(tandem().args(["plugins", "--plugin-dir"]).arg(dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let level = format!(
        "example-squeeze 0.1.0 (API level {}",
        tandem_plugin_api::API_LEVEL
    );
    assert!(text.contains(&level), "{text}");
    assert!(text.contains("bridge  squeeze "), "{text}");
    assert!(
        text.contains("updates: shared_region, tensor_buckets"),
        "{text}"
    );
}

#[test]
fn the_squeeze_bridge_passes_its_tests_and_the_conformance_suite() {
    let root = workspace_root();
    let out = cargo()
        .args(["test", "--offline", "-q", "--manifest-path"])
        .arg(root.join(MANIFEST))
        .env("CARGO_TARGET_DIR", root.join("target/out-of-tree"))
        .output()
        .expect("run cargo");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    // The conformance group's four checks (the unit tests' count is theirs to change).
    assert!(text.contains("4 passed; 0 failed"), "{text}");
}

#[test]
fn tandem_check_refuses_a_bad_squeeze_option_in_one_line_at_its_key() {
    let t = Scratch::new();
    let dir = plugins();
    let job = squeeze_job(&t, 2, "level = 99");
    let out = run(tandem()
        .arg("check")
        .arg(&job)
        .arg("--plugin-dir")
        .arg(dir.path()));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "one error line: {}", stderr(&out));
    assert!(
        errors[0].contains("bridge.options.level: ") && errors[0].contains("not 99"),
        "{errors:?}"
    );
}

/// A figure of the bridge's in a metrics row (`bridge.<name>`, the engines' summed as
/// `bridge.engines.<name>`).
fn figure(m: &serde_json::Value, name: &str) -> f64 {
    m["bridge"][name]
        .as_f64()
        .or_else(|| m[format!("bridge.{name}")].as_f64())
        .unwrap_or_else(|| panic!("no bridge figure `{name}` in {m}"))
}

#[test]
fn two_steps_run_through_the_squeeze_bridge_with_every_sync_verified() {
    // Warm-started: every step trains, so every step syncs.
    let t = Scratch::warm();
    let job = squeeze_job(&t, 2, "bucket_mb = 0.25\nthreads = 2");
    let dir = plugins();
    let out = t.run(&job, &["--plugin-dir", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}\n{}",
        out.stdout_text(),
        out.stderr_text()
    );
    // Every sync verified: each engine's digest of the weights it serves is the trainer's
    // (the native pair's digest is `w64:`, not the `st256:` that
    // `common::assert_every_sync_verified` looks for).
    let syncs: Vec<String> = t
        .events()
        .iter()
        .filter(|e| e["op"] == "sync")
        .map(|e| e["detail"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(syncs.len(), 2, "one sync per step: {syncs:?}");
    for s in &syncs {
        assert!(
            s.contains(" digest w64:") && s.ends_with(" verified true"),
            "{syncs:?}"
        );
    }

    let metrics = t.metrics();
    assert_eq!(steps_of(&metrics), [1, 2], "{metrics:?}");
    for m in &metrics {
        let (raw, wire) = (figure(m, "raw_bytes"), figure(m, "wire_bytes"));
        assert!(wire > 0.0 && wire < raw, "compressed: {m}");
        assert!((figure(m, "ratio") - raw / wire).abs() < 1e-9, "{m}");
        assert!(figure(m, "compress_s") > 0.0, "{m}");
        assert!(figure(m, "transmit_s") >= 0.0, "{m}");
        // Each engine received every frame and decoded it.
        assert_eq!(
            figure(m, "engines.received_bytes"),
            ENGINES as f64 * wire,
            "{m}"
        );
        assert!(figure(m, "engines.decompress_s") > 0.0, "{m}");
        // The host records the bridge's own count of bytes on the wire, once per engine.
        assert_eq!(
            m["sync_bytes"].as_u64().unwrap(),
            ENGINES * wire as u64,
            "{m}"
        );
    }
    let log = std::fs::read_to_string(t.dir.join("run/logs/trainer-0.log")).unwrap();
    assert_eq!(
        log.matches("squeeze bridge: v").count(),
        2,
        "one line per sync:\n{log}"
    );
}
