//! The `sglang` engine attached to a `tandem serve` child through the real RL loop (`tandem
//! run`): two steps of `examples/sglang-native-checkpoint.toml` and of
//! `examples/sglang-native-lora.toml`, verbatim but for the server's URL, on a fresh tiny model.
//! Needs `libtandem_sglang.so` (the README's test command builds the workspace first).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Stdio};

/// A `tandem serve` child, killed when dropped; its stdout stays open while it runs.
struct Serve {
    child: Child,
    _stdout: BufReader<ChildStdout>,
    url: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(model: &Path) -> Serve {
    let mut child = common::tandem()
        .arg("serve")
        .arg(model)
        .args(["--port", "0", "--enable-memory-saver", "--enable-lora"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("tandem serve: listening on ")
        .unwrap_or_else(|| panic!("tandem serve's first line: `{line}`"))
        .to_owned();
    Serve {
        child,
        _stdout: stdout,
        url,
    }
}

fn two_steps_of(example: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("models/tiny-arith");
    common::init_model("tiny", 0, &model);
    // Warm-started (20 supervised steps on a+b over 0..=3): rollouts are digits, rewards vary
    // and every step trains and syncs.
    let warm = tmp.path().join("models/warm");
    let sft = common::run(
        common::tandem()
            .args(["model", "sft", "--model"])
            .arg(&model)
            .arg("--out")
            .arg(&warm)
            .args(["--steps", "20", "--task-options", "max_operand = 3"]),
    );
    assert!(sft.status.success(), "{}", common::stderr(&sft));
    std::fs::remove_dir_all(&model).unwrap();
    std::fs::rename(&warm, &model).unwrap();
    let server = serve(&model);
    let text = std::fs::read_to_string(common::workspace_root().join(example)).unwrap();
    let url_line = "url = \"http://127.0.0.1:30000\"";
    assert!(
        text.contains(url_line),
        "{example} attaches to the default port"
    );
    std::fs::create_dir_all(tmp.path().join("examples")).unwrap();
    let job = tmp.path().join("examples/job.toml");
    let here = format!("url = \"{}\"", server.url);
    std::fs::write(&job, text.replace(url_line, &here)).unwrap();
    let plugins = common::plugin_dir(&[(&common::cdylib("tandem_sglang"), "libtandem_sglang.so")]);
    let run = tmp.path().join("run");
    let out = common::run(
        common::tandem()
            .arg("run")
            .arg(&job)
            .args(["--steps", "2", "--output-dir"])
            .arg(&run)
            .arg("--plugin-dir")
            .arg(plugins.path()),
    );
    assert!(out.status.success(), "{example}: {}", common::stderr(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "{metrics}");
    // The example verifies: every sync's st256 digest was checked before tandem serve loaded
    // the files (the warm model trains at each step, so each step syncs).
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    common::assert_every_sync_verified(&events);
}

#[test]
fn the_checkpoint_example_runs_against_tandem_serve() {
    two_steps_of("examples/sglang-native-checkpoint.toml");
}

#[test]
fn the_lora_example_runs_against_tandem_serve() {
    two_steps_of("examples/sglang-native-lora.toml");
}
