//! The quickstart's promise, with a smaller step budget: under GRPO the reward on the
//! quickstart task rises, for each bridge mode (`checkpoint`, `lora`; `ipc` trains exactly as
//! `checkpoint` does, checked figure for figure over its first steps). One warm-started model
//! is shared by the runs (written once per test process); each run is a real `tandem run` with
//! worker processes. The three runs are three tests, so the test harness runs them beside the
//! others instead of one long test at the end of the suite.

#![allow(clippy::unwrap_used)]

use crate::common::rl::*;
use crate::common::{init_model, process_scratch, run, stderr, tandem};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Mean of `reward_mean` over steps `range` (1-based, inclusive).
fn mean_reward(metrics: &[serde_json::Value], from: usize, to: usize) -> f64 {
    let v: Vec<f64> = metrics[from - 1..to]
        .iter()
        .map(|m| m["reward_mean"].as_f64().unwrap())
        .collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// Runs `steps` steps of the task through `bridge`; its metrics lines.
fn train(
    t: &Scratch,
    model: &Path,
    bridge: &str,
    extra_trainer: &str,
    lr: f32,
    steps: u32,
) -> Vec<serde_json::Value> {
    let job = t.job(&JobOpts {
        steps,
        prompts: 16,
        group: 8,
        max_tokens: 4,
        bridge: bridge.into(),
        extra_trainer: extra_trainer.into(),
        learning_rate: lr,
        task_options: TASK.into(),
        model: Some(model.to_path_buf()),
        ..JobOpts::default()
    });
    let run_dir = t.dir.join(format!("run-{bridge}"));
    let out = t.run(&job, &["--output-dir", run_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{bridge}: {}", out.stderr_text());
    assert!(run_dir.join("plot.png").is_file());
    let metrics = json_lines(&run_dir.join("metrics.jsonl"));
    assert_eq!(metrics.len(), steps as usize);
    metrics
}

/// The reward of a `STEPS`-step run through `bridge` rises; its metrics lines.
fn learns(
    t: &Scratch,
    model: &Path,
    bridge: &str,
    extra_trainer: &str,
    lr: f32,
) -> Vec<serde_json::Value> {
    let metrics = train(t, model, bridge, extra_trainer, lr, STEPS);
    let n = STEPS as usize;
    let start = mean_reward(&metrics, 1, 10);
    let end = mean_reward(&metrics, n - 9, n);
    assert!(
        end >= start + RISE,
        "{bridge}: mean reward {start:.3} over steps 1-10 -> {end:.3} over the last 10 (wanted a rise of {RISE})"
    );
    metrics
}

/// The quickstart's settings with 100 steps instead of 250 (the quickstart's 0.29 -> 0.75
/// takes ~150 steps; after 100 the rise is ~0.25). The bound is a clear rise, not a curve:
/// after the f64 log-sum-exp the LoRA run here rose 0.285 -> 0.426, and float rounding moves
/// these runs between machines.
const STEPS: u32 = 100;
/// Steps of the `ipc` run, compared figure for figure with the `checkpoint` run's first.
const IPC_STEPS: u32 = 20;
const RISE: f64 = 0.1;
const TASK: &str = "max_operand = 3\nreward = \"exact\"\n";

/// The quickstart model after its supervised warm start (60 steps), written once per test
/// process and shared by the runs.
fn warm_model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = process_scratch("rl-learns");
        let init = dir.join("model");
        init_model("tiny", 0, &init);
        let warm = dir.join("warm");
        let out = run(tandem()
            .args(["model", "sft", "--model"])
            .arg(&init)
            .arg("--out")
            .arg(&warm)
            .args(["--steps", "60", "--task-options", "max_operand = 3"]));
        assert!(out.status.success(), "{}", stderr(&out));
        warm
    })
}

#[test]
fn the_reward_rises_through_the_checkpoint_bridge() {
    let t = Scratch::new();
    learns(&t, warm_model(), "checkpoint", "", 3e-4);
}

#[test]
fn the_reward_rises_through_the_lora_bridge() {
    let t = Scratch::new();
    // LoRA at lr 3e-3 sits at the edge of instability: on this machine's CPU the run rose
    // 0.236 -> 0.337 (seed 1) and 0.210 -> 0.337 (seed 2), collapsing to 0 at 1e-2, while
    // another machine's float rounding gave 0.27 -> 0.54. At 2e-3: 0.229 -> 0.430 and
    // 0.205 -> 0.537 (1.5e-3: 0.224 -> 0.419, 0.208 -> 0.406).
    learns(
        &t,
        warm_model(),
        "lora",
        "[trainer.options.lora]\nrank = 8\nalpha = 16\n",
        2e-3,
    );
}

/// `ipc` serves the trainer's own weights where `checkpoint` serves an exact copy of them:
/// the engines sample the same completions and the trainer takes the same steps, so the two
/// curves are equal figure for figure (`IPC_STEPS` steps of each show it; the rise is the
/// checkpoint test's). The `ipc` run is the quickstart as it was recorded
/// (`golden/quickstart-50.toml`, its model the same warm start), `GOLDEN_STEPS` steps of it: on a CPU like the one that
/// recorded `golden/quickstart-50.json` (the loop before the typed plan and the algorithm
/// seam), its rewards, losses and gradient norms are that file's, bit for bit.
#[test]
fn the_ipc_bridge_trains_exactly_as_the_checkpoint_bridge() {
    let t = Scratch::new();
    let checkpoint = quickstart(&t, warm_model(), "checkpoint", IPC_STEPS);
    let ipc = quickstart(&t, warm_model(), "ipc", GOLDEN_STEPS);
    for (a, b) in checkpoint.iter().zip(&ipc) {
        for key in ["reward_mean", "loss", "grad_norm", "weight_version"] {
            assert_eq!(
                a[key], b[key],
                "ipc vs checkpoint, step {}: {key}",
                a["step"]
            );
        }
    }
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/quickstart-50.json")).unwrap();
    let here = cpu();
    if golden["cpu"] != here {
        eprintln!(
            "golden/quickstart-50.json was recorded on {}, this CPU is {here}: its float \
             rounding differs, so only ipc = checkpoint is compared here",
            golden["cpu"]
        );
        return;
    }
    let steps = golden["steps"].as_array().unwrap();
    assert_eq!(steps.len(), GOLDEN_STEPS as usize);
    for (want, got) in steps.iter().zip(&ipc) {
        for key in ["step", "reward_mean", "loss", "grad_norm"] {
            assert_eq!(
                want[key], got[key],
                "the quickstart's step {} differs from the recorded run: {key}",
                want["step"]
            );
        }
    }
}

/// Steps of the quickstart compared with the recorded run.
const GOLDEN_STEPS: u32 = 50;

/// The CPU features the native kernels dispatch on, and the threads they use.
fn cpu() -> serde_json::Value {
    #[cfg(target_arch = "x86_64")]
    let (avx2, fma, avx512f) = (
        std::arch::is_x86_feature_detected!("avx2"),
        std::arch::is_x86_feature_detected!("fma"),
        std::arch::is_x86_feature_detected!("avx512f"),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (avx2, fma, avx512f) = (false, false, false);
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    serde_json::json!({
        "arch": std::env::consts::ARCH,
        "avx2": avx2,
        "fma": fma,
        "avx512f": avx512f,
        "threads": threads,
    })
}

/// `steps` steps of the quickstart as it was when the golden run was recorded
/// (`golden/quickstart-50.toml`: new defaults of `examples/quickstart.toml` are a change of
/// settings, not of the loop) from `model` through `bridge`; its metrics lines.
fn quickstart(t: &Scratch, model: &Path, bridge: &str, steps: u32) -> Vec<serde_json::Value> {
    let text = include_str!("golden/quickstart-50.toml").to_owned();
    let edited = text
        .replace(
            "path = \"../models/tiny-arith\"",
            &format!("path = {:?}", model.display().to_string()),
        )
        .replace(
            "[bridge]\nmode = \"ipc\"",
            &format!("[bridge]\nmode = {bridge:?}"),
        );
    assert!(
        edited.contains(&format!("mode = {bridge:?}"))
            && edited.contains(&model.display().to_string()),
        "the quickstart's model path or bridge moved"
    );
    let job = t.dir.join(format!("quickstart-{bridge}.toml"));
    std::fs::write(&job, edited).unwrap();
    let run_dir = t.dir.join(format!("run-quickstart-{bridge}"));
    let out = t.run(
        &job,
        &[
            "--output-dir",
            run_dir.to_str().unwrap(),
            "--steps",
            &steps.to_string(),
        ],
    );
    assert!(out.status.success(), "quickstart: {}", out.stderr_text());
    let metrics = json_lines(&run_dir.join("metrics.jsonl"));
    assert_eq!(metrics.len(), steps as usize);
    metrics
}
