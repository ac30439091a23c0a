//! Experiment tracking through `tandem run`, `tandem check` and `tandem log push`: a tracker
//! that is down is one warning and the run goes on, its backlog sent later; bad `[logging]`
//! sections are one line from `tandem check`. With the trackers' own packages
//! (`scripts/setup-track.sh`, `#[ignore]`d, run by `.ci/run`): TensorBoard's event
//! accumulator, W&B's offline records and a real `mlflow server` read back every metric of
//! every step, across a `--resume`.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod mlflow;
mod readers;

use crate::common::rl::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A test job of `o` with `logging` (TOML of `[logging]` and its tables) appended.
fn job_with_logging(t: &Scratch, o: &JobOpts, logging: &str) -> PathBuf {
    let path = t.job(o);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(logging);
    std::fs::write(&path, text).unwrap();
    path
}

/// The tracking state of a run (`tracking.json`): target → (last step sent, run id).
fn tracking_state(run: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(run.join("tracking.json")).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// `tracking` warnings of `events.jsonl`.
fn tracking_warnings(t: &Scratch) -> Vec<String> {
    t.events()
        .iter()
        .filter(|e| e["target"] == "tracking")
        .map(|e| e["detail"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Every numeric field of a metrics line as a tracker names it (nested: `a/b`; booleans 0/1),
/// without `step` and `time`: the tracking crate's own reading of a line.
fn scalars(line: &serde_json::Value) -> Vec<(String, f64)> {
    tandem_track::Line::of(line).unwrap().scalars
}

/// The Python of the trackers' packages; panics with how to get it, so an `--ignored` run
/// never passes silently.
fn track_python() -> String {
    std::env::var("TANDEM_TRACK_PYTHON").unwrap_or_else(|_| {
        panic!(
            "TANDEM_TRACK_PYTHON is unset: run `export TANDEM_TRACK_PYTHON=$(bash \
             scripts/setup-track.sh | tail -1)` before `cargo test -p tandem --test it -- \
             --ignored tracking::`"
        )
    })
}

/// `read_back.py ARGS` with the trackers' Python: its JSON.
fn read_back(args: &[&str]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/tracking/read_back.py");
    let out = Command::new(track_python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "read_back.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_tracker_that_is_down_is_one_warning_the_run_goes_on_and_log_push_says_what_it_lacks() {
    let t = Scratch::new();
    let o = JobOpts {
        steps: 3,
        ..JobOpts::default()
    };
    // Port 1 (tcpmux): nothing listens there, every call is refused.
    let job = job_with_logging(
        &t,
        &o,
        "[logging]\ntensorboard = true\n\n[logging.mlflow]\ntracking_uri = \"http://127.0.0.1:1\"\nexperiment = \"t\"\n",
    );
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let warnings = tracking_warnings(&t);
    let down: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("the run goes on"))
        .collect();
    assert_eq!(
        down.len(),
        1,
        "one warning for the outage, not one a step: {warnings:?}"
    );
    assert!(
        down[0].contains("mlflow") && down[0].contains("127.0.0.1:1"),
        "{}",
        down[0]
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("mlflow lacks 3 steps") && w.contains("tandem log push")),
        "{warnings:?}"
    );
    // TensorBoard, which was up, has every step; MLflow none.
    let state = tracking_state(&t.dir.join("run"));
    let tb = state["targets"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, _)| k.starts_with("tensorboard "))
        .map(|(_, v)| v["sent"].clone());
    assert_eq!(tb, Some(serde_json::json!(3)), "{state}");
    assert!(state["targets"]["mlflow t"]["sent"].is_null(), "{state}");
    let events = std::fs::read_dir(t.dir.join("run/tensorboard"))
        .unwrap()
        .count();
    assert_eq!(events, 1, "one event file");
    // `tandem log push` tries again, and says what is still missing.
    let out = t.tandem(&["log", "push", "run"]);
    assert!(!out.status.success());
    let lines = crate::common::error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("mlflow still lacks 3 steps"),
        "{}",
        lines[0]
    );
}

#[test]
fn log_push_writes_a_finished_runs_metrics_to_a_tracker_it_never_had() {
    let t = Scratch::new();
    let o = JobOpts {
        steps: 2,
        ..JobOpts::default()
    };
    let job = t.job(&o);
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(!t.dir.join("run/tracking.json").exists());
    let out = t.tandem(&["log", "push", "run"]);
    assert!(!out.status.success(), "no tracker named: an error");
    assert!(
        out.stderr_text().contains("--tensorboard"),
        "{}",
        out.stderr_text()
    );
    let out = t.tandem(&["log", "push", "run", "--tensorboard"]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        out.stdout_text().contains("tensorboard: sent 2 steps"),
        "{}",
        out.stdout_text()
    );
    // Pushed again: nothing new to send.
    let out = t.tandem(&["log", "push", "run", "--tensorboard"]);
    assert!(
        out.stdout_text().contains("tensorboard: sent 0 steps"),
        "{}",
        out.stdout_text()
    );
}

#[test]
fn bad_logging_sections_are_one_line_from_check() {
    let t = Scratch::new();
    let o = JobOpts::default();
    // A "Python" without the wandb package, as such a Python answers `import wandb`.
    let fake = t.dir.join("python-without-wandb");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'wandb'\" >&2\nexit 1\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).unwrap();
    let cases: [(&str, &str, &str); 4] = [
        ("[logging]\ntensorbord = true\n", "logging", "tensorbord"),
        (
            "[logging.mlflow]\ntracking_uri = \"file:///tmp/mlruns\"\n",
            "logging.mlflow.tracking_uri",
            "'file://'",
        ),
        (
            "[logging.wandb]\nmode = \"later\"\n",
            "logging.wandb.mode",
            "later",
        ),
        (
            &format!(
                "[logging]\npython = \"{}\"\n\n[logging.wandb]\nproject = \"p\"\n",
                fake.display()
            ),
            "logging.python",
            "No module named 'wandb'",
        ),
    ];
    for (logging, key, what) in cases {
        let job = job_with_logging(&t, &o, logging);
        let out = t.tandem(&["check", job.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{logging}: {}",
            out.stderr_text()
        );
        let lines = crate::common::error_lines(&out);
        assert_eq!(lines.len(), 1, "{logging}: {lines:?}");
        assert!(
            lines[0].contains(key) && lines[0].contains(what),
            "{logging}: {}",
            lines[0]
        );
    }
}
