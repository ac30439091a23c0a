//! The quickstart's promise, with a smaller step budget: under GRPO the reward on the
//! quickstart task rises, for each bridge mode (`checkpoint`, `lora`, `ipc`). One warm-started
//! model is shared by the three runs; each run is a real `tandem run` with worker processes.

#![allow(clippy::unwrap_used)]

mod rl_common;

use rl_common::*;
use std::path::Path;

/// Mean of `reward_mean` over steps `range` (1-based, inclusive).
fn mean_reward(metrics: &[serde_json::Value], from: usize, to: usize) -> f64 {
    let v: Vec<f64> = metrics[from - 1..to]
        .iter()
        .map(|m| m["reward_mean"].as_f64().unwrap())
        .collect();
    v.iter().sum::<f64>() / v.len() as f64
}

fn learns(t: &Scratch, model: &Path, bridge: &str, extra_trainer: &str, lr: f32) {
    let job = t.job(&JobOpts {
        steps: STEPS,
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
    let metrics: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(metrics.len(), STEPS as usize);
    let n = STEPS as usize;
    let start = mean_reward(&metrics, 1, 10);
    let end = mean_reward(&metrics, n - 9, n);
    assert!(
        end >= start + RISE,
        "{bridge}: mean reward {start:.3} over steps 1-10 -> {end:.3} over the last 10 (wanted a rise of {RISE})"
    );
    assert!(run_dir.join("plot.png").is_file());
}

/// The quickstart's settings with 100 steps instead of 250 (the quickstart's 0.29 -> 0.75
/// takes ~150 steps; after 100 the rise is ~0.25). The bound is a clear rise, not a curve:
/// after the f64 log-sum-exp the LoRA run here rose 0.285 -> 0.426, and float rounding moves
/// these runs between machines.
const STEPS: u32 = 100;
const RISE: f64 = 0.1;
const TASK: &str = "max_operand = 3\nreward = \"exact\"\n";

#[test]
fn the_reward_rises_for_every_bridge_mode() {
    let t = Scratch::new();
    let model = t.dir.join("warm");
    let out = t.tandem(&[
        "model",
        "sft",
        "--model",
        t.dir.join("model").to_str().unwrap(),
        "--out",
        model.to_str().unwrap(),
        "--steps",
        "60",
        "--task-options",
        "max_operand = 3",
    ]);
    assert!(out.status.success(), "{}", out.stderr_text());
    learns(&t, &model, "checkpoint", "", 3e-4);
    // LoRA at lr 3e-3 sits at the edge of instability: on this machine's CPU the run rose
    // 0.236 -> 0.337 (seed 1) and 0.210 -> 0.337 (seed 2), collapsing to 0 at 1e-2, while
    // another machine's float rounding gave 0.27 -> 0.54. At 2e-3: 0.229 -> 0.430 and
    // 0.205 -> 0.537 (1.5e-3: 0.224 -> 0.419, 0.208 -> 0.406).
    learns(
        &t,
        &model,
        "lora",
        "[trainer.options.lora]\nrank = 8\nalpha = 16\n",
        2e-3,
    );
    learns(&t, &model, "ipc", "", 3e-4);
}
