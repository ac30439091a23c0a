//! Cluster launchers without a cluster (the tests with one are the `cluster` target's).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::process::Command;

/// The `ray` launcher of the `cluster` target's Ray tests.
const LAUNCHER: &str = r#"[launcher]
kind = "ray"
address = "10.77.1.1:6379"
strategy = "STRICT_SPREAD"
advertise = "auto"
engine_nodes = ["10.77.1.1"]
trainer_nodes = ["10.77.1.2"]"#;

/// No cluster at the address (and, where the python lacks `ray`, no Ray at all): one error
/// line that names the placement group and what to fix, a non-zero exit, no hang. The
/// controller advertises the route toward the head's address (`auto`, no nodes pinned).
#[test]
fn a_ray_job_without_a_reachable_cluster_is_one_error_line() {
    let t = tempfile::tempdir().unwrap();
    let launcher = LAUNCHER
        .replace("10.77.1.1:6379", "127.0.0.1:9")
        .replace(
            "engine_nodes = [\"10.77.1.1\"]\ntrainer_nodes = [\"10.77.1.2\"]",
            "",
        )
        .replace("STRICT_SPREAD", "PACK");
    // A fresh model, not warm-started: the run fails before it would train.
    let text = crate::hosts::job_text("checkpoint", 1, "", &t.path().join("model"), &launcher)
        .replace("warm_start_steps = 60", "warm_start_steps = 0");
    let job = t.path().join("ray.toml");
    std::fs::write(&job, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("run")
        .arg(&job)
        .env("TANDEM_RAY_PYTHON", "python3")
        .current_dir(t.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", crate::hosts::text(&out));
    let errors = common::error_lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = &errors[0];
    assert!(e.contains("Ray placement group"), "{e}");
    assert!(
        e.contains("cannot reach the Ray cluster at 127.0.0.1:9") || e.contains("has no `ray`"),
        "{e}"
    );
}
