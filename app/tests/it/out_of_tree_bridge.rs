//! `examples/out-of-tree-bridge` (plugin `example-delta`, bridge `delta`) is a separate crate
//! depending on `tandem-plugin-api` by path only: it builds on its own, `tandem plugins
//! --plugin-dir` lists its bridge, `tandem check` resolves a job's `[bridge] plugin =
//! "delta"` to it (and refuses its bad options at their key), and `tandem run` syncs a native
//! trainer and two native engines through it for 3 steps: the first sync ships every tensor,
//! and each step's sync bytes are what the bridge says it shipped, once per engine. Its own
//! `tests/conformance.rs` passes the bridge checks of `tandem-conformance`.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::rl::{JobOpts, OutputText, Scratch, steps_of};
use crate::common::{
    build_example, cargo, error_lines, plugin_dir, run, stderr, stdout, tandem, workspace_root,
};
use std::path::PathBuf;
use std::sync::OnceLock;

const LIB: &str = "libtandem_example_delta.so";
/// Engine ranks of the test jobs: a broadcast with more than one receiver.
const ENGINES: u64 = 2;

/// Builds the example once per test process (into the scratch target dir the other
/// out-of-tree test uses) and returns the library.
fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| build_example("examples/out-of-tree-bridge/Cargo.toml", LIB))
        .clone()
}

/// A plugin directory holding only the example's library.
fn plugins() -> tempfile::TempDir {
    plugin_dir(&[(&library(), LIB)])
}

/// A job of `engines` native engines and the native trainer over the `delta` bridge.
fn delta_job(t: &Scratch, steps: u32, bridge_options: &str) -> PathBuf {
    t.job(&JobOpts {
        steps,
        engines: ENGINES as u32,
        bridge: "delta".into(),
        bridge_options: bridge_options.into(),
        ..JobOpts::default()
    })
}

#[test]
fn the_delta_bridge_builds_out_of_tree_and_is_listed() {
    let dir = plugins();
    let out = run(tandem().args(["plugins", "--plugin-dir"]).arg(dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let level = format!(
        "example-delta 0.1.0 (API level {}",
        tandem_plugin_api::API_LEVEL
    );
    assert!(text.contains(&level), "{text}");
    assert!(text.contains("bridge  delta "), "{text}");
    assert!(
        text.contains("updates: shared_region, tensor_buckets"),
        "{text}"
    );
}

#[test]
fn the_delta_bridge_passes_the_conformance_suite() {
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
        .arg(root.join("examples/out-of-tree-bridge/Cargo.toml"))
        .env("CARGO_TARGET_DIR", root.join("target/out-of-tree"))
        .output()
        .expect("run cargo");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("4 passed; 0 failed"), "{text}");
}

#[test]
fn tandem_check_resolves_the_delta_bridge_to_its_plugin() {
    let t = Scratch::new();
    let job = delta_job(&t, 3, "bucket_mb = 1.0");
    let dir = plugins();
    let out = run(tandem()
        .arg("check")
        .arg(&job)
        .arg("--plugin-dir")
        .arg(dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            "bridge     delta from plugin `example-delta`: trainer exports shared_region, \
             engines apply tensor_buckets"
        ),
        "{text}"
    );
    // Without the plugin directory no plugin provides it.
    let out = run(tandem().arg("check").arg(&job));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert!(
        errors[0].contains("bridge.mode: no loaded plugin provides the bridge `delta`"),
        "{errors:?}"
    );
}

#[test]
fn tandem_check_refuses_a_bad_delta_option_in_one_line_at_its_key() {
    let t = Scratch::new();
    let dir = plugins();
    for (options, key, says) in [
        (
            "bucket_mb = \"x\"",
            "bridge.options.bucket_mb",
            "invalid type",
        ),
        (
            "bucket_mb = 0.0",
            "bridge.options.bucket_mb",
            "between 0.001 and 65536",
        ),
        (
            "bucket_mb = 8.0\nzip = true",
            "bridge.options.zip",
            "unknown field",
        ),
    ] {
        let job = delta_job(&t, 3, options);
        let out = run(tandem()
            .arg("check")
            .arg(&job)
            .arg("--plugin-dir")
            .arg(dir.path()));
        assert_eq!(out.status.code(), Some(2), "{options}: {}", stderr(&out));
        let errors = error_lines(&out);
        assert_eq!(
            errors.len(),
            1,
            "{options}: one error line: {}",
            stderr(&out)
        );
        assert!(
            errors[0].contains(&format!("{key}: ")) && errors[0].contains(says),
            "{options}: expected `{key}` and `{says}` in {errors:?}"
        );
    }
}

/// `(version, tensors shipped, tensors in all, bytes shipped, bytes in all)` of each line the
/// bridge logged in the trainer's worker log, and whether the line says "first sync".
fn shipped(log: &str) -> Vec<([u64; 5], bool)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split("delta bridge: v").nth(1)?;
            let words: Vec<&str> = rest.split([' ', ',']).filter(|w| !w.is_empty()).collect();
            // "3 ships 5 of 30 tensors 100 of 400 bytes in 2 buckets"
            let n = |i: usize| {
                words
                    .get(i)
                    .and_then(|w| w.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("not a line of the delta bridge's format: {l}"))
            };
            Some(([n(0), n(2), n(4), n(6), n(8)], l.contains("first sync")))
        })
        .collect()
}

/// `tandem run` of 3 steps in `placement` on a warm-started model (every step trains, so
/// every step syncs): exit 0, versions going up, and each step's sync bytes are the bytes the
/// bridge logged for that version, received by each engine.
fn three_steps(placement: &str) {
    let t = Scratch::warm();
    let job = t.job(&JobOpts {
        steps: 3,
        engines: ENGINES as u32,
        placement: placement.into(),
        bridge: "delta".into(),
        bridge_options: "bucket_mb = 1.0".into(),
        ..JobOpts::default()
    });
    let dir = plugins();
    let out = t.run(&job, &["--plugin-dir", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{placement}: {}\n{}",
        out.stdout_text(),
        out.stderr_text()
    );

    let metrics = t.metrics();
    assert_eq!(metrics.len(), 3, "{metrics:?}");
    let steps = steps_of(&metrics);
    assert_eq!(steps, [1, 2, 3]);
    let versions: Vec<u64> = metrics
        .iter()
        .map(|m| m["weight_version"].as_u64().unwrap())
        .collect();
    assert!(
        versions[0] >= 1 && versions.windows(2).all(|w| w[0] < w[1]),
        "weight versions must go up: {versions:?}"
    );
    let bytes: Vec<u64> = metrics
        .iter()
        .map(|m| m["sync_bytes"].as_u64().unwrap())
        .collect();
    assert!(bytes.iter().all(|&b| b > 0), "sync bytes: {bytes:?}");

    // What the bridge says it shipped (the trainer worker's log) is what the engines got.
    let log = std::fs::read_to_string(t.dir.join("run/logs/trainer-0.log")).unwrap();
    let lines = shipped(&log);
    assert_eq!(lines.len(), 3, "one line per sync:\n{log}");
    let ([_, first, all, first_bytes, all_bytes], first_sync) = lines[0];
    assert!(first_sync, "{log}");
    assert_eq!(
        (first, first_bytes),
        (all, all_bytes),
        "the first sync ships everything"
    );
    for (m, ([version, tensors, all_tensors, sent, all_sent], is_first)) in
        metrics.iter().zip(&lines)
    {
        assert_eq!(*version, m["weight_version"].as_u64().unwrap(), "{log}");
        assert!(tensors <= all_tensors && sent <= all_sent, "{log}");
        assert_eq!((*all_tensors, *all_sent), (all, all_bytes), "{log}");
        assert_eq!(
            m["sync_bytes"].as_u64().unwrap(),
            ENGINES * sent,
            "step {}: each engine received the bytes the bridge shipped (first sync: {is_first})",
            m["step"]
        );
        // The bridge's own figures (its `stats()`) are in the step's metrics.
        let stats = &m["bridge"];
        assert_eq!(stats["shipped_bytes"].as_f64(), Some(*sent as f64), "{m}");
        assert_eq!(
            stats["shipped_tensors"].as_f64(),
            Some(*tensors as f64),
            "{m}"
        );
        assert!(stats["transmit_s"].as_f64().is_some_and(|s| s > 0.0), "{m}");
        // The sync's clock covers the trainer half (the export's RPC holds its `ship`).
        assert!(m["sync_s"].as_f64() >= stats["ship_s"].as_f64(), "{m}");
    }
    if placement == "colocate" {
        // The bridge keeps the engines' weights resident (its baseline), not the trainer's:
        // the drained offload releases everything else of the engines, and the trainer
        // offloads its weights after every sync.
        let events = t.events();
        let with = |target: &str, op: &str| -> Vec<String> {
            events
                .iter()
                .filter(|e| {
                    e["target"].as_str().is_some_and(|t| t.starts_with(target)) && e["op"] == op
                })
                .map(|e| e["detail"].as_str().unwrap_or_default().to_owned())
                .collect()
        };
        let released = with("engine-", "release");
        assert!(
            !released.is_empty(),
            "the engines release memory: {events:?}"
        );
        assert!(
            released
                .iter()
                .all(|d| !d.split(',').any(|t| t == "weights")),
            "an engine released its weights: {released:?}"
        );
        let offloaded = with("trainer", "offload");
        assert!(
            offloaded
                .iter()
                .filter(|d| d.split(',').any(|t| t == "weights"))
                .count()
                >= 3,
            "the trainer offloads its weights after every sync: {offloaded:?}"
        );
    }
}

#[test]
fn three_colocated_steps_run_end_to_end_through_the_delta_bridge() {
    three_steps("colocate");
}

#[test]
fn three_disaggregated_steps_run_end_to_end_through_the_delta_bridge() {
    three_steps("disaggregated");
}
