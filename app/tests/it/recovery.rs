//! Runs survive their workers, through `tandem run` with real worker processes: a seeded
//! chaos schedule (`TANDEM_CHAOS`) SIGKILLs a random worker (an engine rank or the trainer)
//! at a random point of every third step for 60 steps, for each built-in bridge; the run
//! finishes on its own, records every step exactly once, and ends with the very weights
//! (byte for byte) of the uninterrupted run with the same seed. Also: the restart budget
//! stops a run that keeps losing the same worker (saying which, how often), a worker that
//! cannot start again stops the run at once with its log tail, and a SIGKILLed controller
//! leaves no worker behind and `--resume` ends with the same weights.

#![allow(clippy::unwrap_used)]

use crate::common::rl::{
    JobOpts, OutputText, Scratch, json_lines, kill_controller, kill9, steps_of, wait_for,
    wait_output, worker_pid,
};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

const STEPS: u32 = 60;

/// `tandem run JOB --output-dir OUT` with `TANDEM_CHAOS` set to `chaos` (if any).
fn run(t: &Scratch, job: &Path, out: &str, chaos: Option<&str>) -> Output {
    let mut cmd = Command::new(crate::common::rl::tandem_bin());
    cmd.args(["run", job.to_str().unwrap(), "--output-dir", out])
        .current_dir(&t.dir);
    match chaos {
        Some(c) => cmd.env("TANDEM_CHAOS", c),
        None => cmd.env_remove("TANDEM_CHAOS"),
    };
    cmd.output().unwrap()
}

/// The trained weights of the last checkpoint of a run (a LoRA run's adapter).
fn final_weights(run: &Path) -> Vec<u8> {
    let dir = run.join(format!("checkpoints/step-{STEPS:06}"));
    for f in ["model.safetensors", "adapter_model.safetensors"] {
        if let Ok(bytes) = std::fs::read(dir.join(f)) {
            return bytes;
        }
    }
    panic!("no weights in {}", dir.display());
}

/// A job of 2 engine ranks through `bridge`, checkpoints every 7 steps (so replays span
/// several batches), restarts without waiting.
fn job(t: &Scratch, bridge: &str) -> std::path::PathBuf {
    let lora = "[trainer.options.lora]\nrank = 4\nalpha = 8.0\n";
    t.job(&JobOpts {
        engines: 2,
        steps: STEPS,
        save_every: 7,
        prompts: 4,
        group: 4,
        bridge: bridge.into(),
        extra_trainer: if bridge == "lora" {
            lora.into()
        } else {
            String::new()
        },
        extra_run: "restart_backoff_secs = 0.0\nmax_restarts = 30\nmax_restarts_per_run = 60\n"
            .into(),
        ..JobOpts::default()
    })
}

/// What an uninterrupted run ended with: its final weights and its metrics lines.
struct Calm {
    weights: Vec<u8>,
    metrics: Vec<serde_json::Value>,
}

/// The uninterrupted run of full fine-tuning, shared by the tests of `ipc`, `checkpoint` and
/// `broadcast`: all three serve the trainer's exact weights, so the engines sample the same
/// completions and the three runs train the same weights, byte for byte. A LoRA run trains
/// an adapter: its own.
fn calm(bridge: &str) -> &'static Calm {
    static FULL: OnceLock<Calm> = OnceLock::new();
    static LORA: OnceLock<Calm> = OnceLock::new();
    let (cell, bridge) = if bridge == "lora" {
        (&LORA, "lora")
    } else {
        (&FULL, "ipc")
    };
    cell.get_or_init(|| {
        let t = Scratch::new();
        let job = job(&t, bridge);
        let out = run(&t, &job, "calm", None);
        assert!(out.status.success(), "{bridge}: {}", out.stderr_text());
        let dir = t.dir.join("calm");
        Calm {
            weights: final_weights(&dir),
            metrics: json_lines(&dir.join("metrics.jsonl")),
        }
    })
}

fn chaos_run_ends_with_the_uninterrupted_weights(bridge: &str, seed: u64) {
    let calm = calm(bridge);
    let t = Scratch::new();
    let job = job(&t, bridge);
    let chaos = format!("seed={seed},every=3");
    let out = run(&t, &job, "chaos", Some(&chaos));
    let err = out.stderr_text();
    assert!(out.status.success(), "{bridge} under {chaos}: {err}");
    let dir = t.dir.join("chaos");

    // Every step exactly once, in order.
    let metrics = json_lines(&dir.join("metrics.jsonl"));
    let steps = steps_of(&metrics);
    assert_eq!(
        steps,
        (1..=u64::from(STEPS)).collect::<Vec<_>>(),
        "{bridge}"
    );

    // Each kill dealt is one death, one restart (or relaunch) and recovered.
    let kills = err.matches("chaos: killing").count();
    assert_eq!(
        kills as u32,
        STEPS / 3 - 1,
        "{bridge}: one kill every third step but the last"
    );
    let events = json_lines(&dir.join("events.jsonl"));
    let count = |op: &str| events.iter().filter(|e| e["op"] == op).count();
    let deaths = count("death");
    if bridge == "checkpoint" {
        // An engine killed between the training and the sync is replaced by the bridge's
        // own restart on the new checkpoint before any call finds it dead.
        assert!(
            deaths <= kills && deaths >= kills / 2,
            "{bridge}: {deaths} deaths: {err}"
        );
    } else {
        assert_eq!(deaths, kills, "{bridge}: {err}");
    }
    assert!(
        count("recovered") >= 1 && count("recovered") <= deaths,
        "{bridge}"
    );
    let restarted = count("restart") + count("relaunch");
    assert!(restarted >= count("recovered"), "{bridge}");
    assert_eq!(
        metrics.last().unwrap()["restarts"].as_u64(),
        Some(deaths as u64),
        "{bridge}"
    );
    let victims: Vec<&str> = events
        .iter()
        .filter(|e| e["op"] == "death")
        .map(|e| e["target"].as_str().unwrap())
        .collect();
    assert!(
        victims.contains(&"trainer"),
        "{bridge}: the schedule killed no trainer: {victims:?}"
    );
    assert!(
        victims.iter().any(|v| v.starts_with("engine-")),
        "{bridge}: the schedule killed no engine: {victims:?}"
    );
    // A restarted trainer replayed what it lost.
    assert!(count("replay") >= 1, "{bridge}");

    assert!(
        final_weights(&dir) == calm.weights,
        "{bridge}: the final weights differ from the uninterrupted run's"
    );
    // The rewards of every step too (same samples: the engines are deterministic).
    for (a, b) in calm.metrics.iter().zip(&metrics) {
        assert_eq!(
            a["reward_mean"], b["reward_mean"],
            "{bridge} step {}",
            a["step"]
        );
        assert_eq!(
            a["weight_version"], b["weight_version"],
            "{bridge} step {}",
            a["step"]
        );
    }
}

#[test]
fn chaos_ipc() {
    chaos_run_ends_with_the_uninterrupted_weights("ipc", 11);
}

#[test]
fn chaos_lora() {
    chaos_run_ends_with_the_uninterrupted_weights("lora", 12);
}

#[test]
fn chaos_checkpoint() {
    chaos_run_ends_with_the_uninterrupted_weights("checkpoint", 13);
}

#[test]
fn chaos_broadcast() {
    chaos_run_ends_with_the_uninterrupted_weights("broadcast", 14);
}

#[test]
fn a_worker_that_keeps_dying_stops_the_run_past_its_budget() {
    let t = Scratch::new();
    let job = t.job(&JobOpts {
        steps: 6,
        extra_run: "restart_backoff_secs = 0.0\nmax_restarts = 1\n".into(),
        ..JobOpts::default()
    });
    let out = run(&t, &job, "run", Some("seed=1,every=1,victim=engine"));
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr_text());
    let err = out.stderr_text();
    assert!(
        err.contains("engine-0 died 2 times, more than [run] max_restarts = 1"),
        "{err}"
    );
    assert!(err.contains("logs/engine-0.log"), "{err}");
    // Step 1 finished after the first restart and is recorded; the run stopped in step 2.
    let steps = steps_of(&json_lines(&t.dir.join("run/metrics.jsonl")));
    assert_eq!(steps, vec![1], "{err}");
}

#[test]
fn a_worker_that_cannot_start_again_stops_the_run_at_once() {
    let t = Scratch::new();
    let job = t.job(&JobOpts {
        steps: 200,
        extra_run: "restart_backoff_secs = 0.0\n".into(),
        ..JobOpts::default()
    });
    let mut child = t.spawn(&job, &[]);
    wait_for(Duration::from_secs(120), || t.metrics_lines() >= 1);
    // The engine restarts on the job's model: damaged now, so the new worker dies at start.
    let weights = t.dir.join("model/model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap();
    f.set_len(len / 2).unwrap();
    drop(f);
    let pid = worker_pid(&t.dir.join("run"), "engine", 0).expect("engine worker pid");
    kill9(pid);
    let out = wait_output(&mut child, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr_text());
    let err = out.stderr_text();
    assert!(
        err.contains("restarting engine-0 after its death failed"),
        "{err}"
    );
    assert!(err.contains("failed to start"), "{err}");
    let deaths = t.events().iter().filter(|e| e["op"] == "death").count();
    assert_eq!(
        deaths, 1,
        "one death, no retry of a worker that cannot start: {err}"
    );
}

#[test]
fn a_killed_controller_leaves_no_worker_and_resumes_to_the_same_weights() {
    let calm = calm("ipc");
    let t = Scratch::new();
    let job = job(&t, "ipc");
    let mut child = Command::new(crate::common::rl::tandem_bin())
        .args(["run", job.to_str().unwrap(), "--output-dir", "run"])
        .current_dir(&t.dir)
        .env_remove("TANDEM_CHAOS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Past the first checkpoint (step 7), well before the end.
    wait_for(Duration::from_secs(300), || t.metrics_lines() >= 9);
    let run_dir = t.dir.join("run");
    kill_controller(
        &mut child,
        &run_dir,
        &[("engine", 0), ("engine", 1), ("trainer", 0)],
    );
    let out = t.tandem(&["run", "--resume", "run"]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        final_weights(&run_dir) == calm.weights,
        "the resumed run's final weights differ from the uninterrupted run's"
    );
    let steps = steps_of(&json_lines(&run_dir.join("metrics.jsonl")));
    assert_eq!(steps, (1..=u64::from(STEPS)).collect::<Vec<_>>());
}
