//! The drafter-training job end to end through `tandem run` (real worker processes, hidden
//! states over a shared-memory transport group): it trains and measures acceptance, the
//! shm route and the control-plane route give the same drafter, the saved drafter decodes
//! speculatively with `tandem generate` (the same greedy tokens), bad drafter inputs are
//! one line each; an RL run trains its drafter in the rollouts' bubbles (`rl.rs`). The
//! shipped example's 1000-step soak is `tandem bench soak`.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod engine;
mod rl;

use crate::common::rl::Scratch;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A drafter job over the scratch's model.
fn job(t: &Scratch, name: &str, steps: u32, extra_drafter: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "{name}"
output_dir = "{name}"
steps = {steps}
seed = 3
save_every = 0

[model]
path = "{model}"

[engine]
plugin = "native"

[engine.options]
max_batch = 16
max_seq_len = 48
draft_tokens = 3

[trainer]
plugin = "native-drafter"

[trainer.options]
ttt_steps = 3
max_tokens = 512

[bridge]
mode = "checkpoint"

[algorithm]
name = "drafter"
prompts_per_step = 6
group_size = 2
max_tokens = 12
temperature = 1.0
learning_rate = 0.003

[drafter]
eval_prompts = 4
ignore_eos = true
{extra_drafter}

[task]
kind = "arithmetic"

[task.options]
max_operand = 3
"#,
        model = t.dir.join("model").display()
    );
    let path = t.dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn metrics(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn run_ok(t: &Scratch, job: &Path) {
    let out = t.tandem(&["run", job.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_drafter_job_trains_on_shm_hidden_states_and_measures_acceptance() {
    let t = Scratch::warm();
    let job = job(&t, "train", 16, "eval_every = 8\n");
    run_ok(&t, &job);
    let run = t.dir.join("train");
    let m = metrics(&run);
    assert_eq!(m.len(), 17, "step 0 + 16 steps");
    let m0 = m[0].clone();
    assert_eq!(m0["step"], 0);
    assert!(m0["acceptance_length"].as_f64().is_some(), "{m0}");
    let m: Vec<Value> = m.into_iter().skip(1).collect();
    let loss = |i: usize| m[i]["loss"].as_f64().unwrap();
    assert!(
        loss(15) < loss(0),
        "the drafter loss falls: {} -> {}",
        loss(0),
        loss(15)
    );
    for line in &m {
        assert_eq!(line["route"], "transport");
        assert_eq!(line["acc"].as_array().unwrap().len(), 3, "{line}");
        let rows = line["feature_rows"].as_u64().unwrap();
        // tiny: 3 aux layers x hidden 256 f32 per row.
        assert_eq!(line["transfer_bytes"].as_u64().unwrap(), rows * 3 * 256 * 4);
        assert!(rows > 0);
    }
    let accept: Vec<(u64, f64)> = m
        .iter()
        .filter_map(|l| Some((l["step"].as_u64()?, l["acceptance_length"].as_f64()?)))
        .collect();
    assert_eq!(accept.iter().map(|a| a.0).collect::<Vec<_>>(), vec![8, 16]);
    for (_, a) in &accept {
        assert!((1.0..=4.0).contains(a), "acceptance {a} within 1..=k+1");
    }
    assert!(run.join("plot.png").is_file());
    let drafter = run.join("checkpoints/step-16");
    assert!(drafter.join("config.json").is_file());

    // The saved drafter decodes speculatively: the same greedy tokens as without it.
    let generate = |drafter: Option<&Path>| {
        let mut args = vec![
            "generate".to_string(),
            "--model".into(),
            t.dir.join("model").display().to_string(),
            "--prompt-ids".into(),
            "1,5,6,7".into(),
            "--max-tokens".into(),
            "20".into(),
            "--json".into(),
        ];
        if let Some(d) = drafter {
            args.extend(["--drafter".into(), d.display().to_string()]);
            args.extend(["--draft-tokens".into(), "3".into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = t.tandem(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let plain = generate(None);
    let spec = generate(Some(&drafter));
    assert_eq!(plain["tokens"], spec["tokens"]);
    let a = spec["acceptance_length"].as_f64().unwrap();
    assert!((1.0..=4.0).contains(&a), "{a}");
    assert!(plain.get("acceptance_length").is_none());
}

/// Seed 002's validation: the same step with the hidden states delivered over shm and
/// through the control plane gives the same gradients, hence the same drafter.
#[test]
fn shm_and_control_plane_hidden_states_give_the_same_step() {
    let t = Scratch::warm();
    let shm = job(&t, "shm", 1, "route = \"transport\"\n");
    let ctl = job(&t, "ctl", 1, "route = \"control\"\n");
    run_ok(&t, &shm);
    run_ok(&t, &ctl);
    let (a, b) = (metrics(&t.dir.join("shm")), metrics(&t.dir.join("ctl")));
    assert_eq!(a[1]["route"], "transport");
    assert_eq!(b[1]["route"], "control");
    for key in [
        "loss",
        "grad_norm",
        "tokens",
        "feature_rows",
        "transfer_bytes",
    ] {
        assert_eq!(a[1][key], b[1][key], "{key}");
    }
    assert_eq!(a[1]["acc"], b[1]["acc"]);
    let weights = |run: &str| {
        let f = t.dir.join(run).join("checkpoints/step-1/model.safetensors");
        let bytes = std::fs::read(f).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let v = st.tensor(&n).unwrap();
                (n, v.dtype(), v.data().to_vec())
            })
            .collect::<Vec<_>>()
    };
    let (wa, wb) = (weights("shm"), weights("ctl"));
    assert_eq!(wa.len(), wb.len());
    let mut worst = 0f32;
    for ((na, da, xa), (nb, _, xb)) in wa.iter().zip(&wb) {
        assert_eq!(na, nb);
        if *da != safetensors::Dtype::F32 {
            assert_eq!(xa, xb, "{na}");
            continue;
        }
        let fa: &[f32] = bytemuck::cast_slice(xa);
        let fb: &[f32] = bytemuck::cast_slice(xb);
        for (x, y) in fa.iter().zip(fb) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst <= 1e-6, "per-parameter difference {worst}");
}

#[test]
fn bad_drafter_inputs_are_one_line_each() {
    let t = Scratch::warm();
    let check_fails = |job: &Path, want: &str| {
        let out = t.tandem(&["check", job.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains(want), "{want:?} in:\n{err}");
        err
    };
    // draft_tokens = 0.
    let j = job(&t, "zero", 1, "");
    let text = std::fs::read_to_string(&j)
        .unwrap()
        .replace("draft_tokens = 3", "draft_tokens = 0");
    std::fs::write(&j, text).unwrap();
    check_fails(&j, "draft_tokens");
    // speculate_below_batch = 0.
    let j = job(&t, "never", 1, "");
    let text = std::fs::read_to_string(&j).unwrap().replace(
        "draft_tokens = 3",
        "draft_tokens = 3\nspeculate_below_batch = 0",
    );
    std::fs::write(&j, text).unwrap();
    let err = check_fails(&j, "speculate_below_batch");
    assert!(err.contains("must be at least 1"), "{err}");

    // A drafter job with a GRPO trainer, and with the wrong bridge.
    let j = job(&t, "grpo-trainer", 1, "");
    let text = std::fs::read_to_string(&j)
        .unwrap()
        .replace("plugin = \"native-drafter\"", "plugin = \"native\"")
        .replace("[trainer.options]\nttt_steps = 3\nmax_tokens = 512\n", "")
        .replace("mode = \"checkpoint\"", "mode = \"ipc\"");
    std::fs::write(&j, text).unwrap();
    let err = check_fails(&j, "does not declare that it can train a drafter");
    assert!(err.contains("set plugin = \"checkpoint\""), "{err}");

    // A drafter for another model (hidden size 512, not 256), named by the engine.
    let small = t.dir.join("small");
    let out = t.tandem(&[
        "model",
        "init",
        "--preset",
        "small",
        "--out",
        small.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let other = job(&t, "other", 1, "");
    let text = std::fs::read_to_string(&other).unwrap().replace(
        &t.dir.join("model").display().to_string(),
        &small.display().to_string(),
    );
    std::fs::write(&other, text).unwrap();
    run_ok(&t, &other);
    let foreign = t.dir.join("other/checkpoints/step-1");
    let j = job(&t, "foreign", 1, "");
    let text = std::fs::read_to_string(&j).unwrap().replace(
        "draft_tokens = 3",
        &format!("draft_tokens = 3\ndrafter = \"{}\"", foreign.display()),
    );
    std::fs::write(&j, text).unwrap();
    let err = check_fails(&j, "does not fit the model");
    assert!(err.contains("hidden size"), "{err}");

    // `tandem generate --drafter`: a corrupt drafter file is one line, exit 2.
    let corrupt = t.dir.join("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            t.dir.join("other/checkpoints/step-1").join(f),
            corrupt.join(f),
        )
        .unwrap();
    }
    let generate_with = |drafter: &Path| {
        t.tandem(&[
            "generate",
            "--model",
            t.dir.join("small").to_str().unwrap(),
            "--prompt-ids",
            "1,5,6",
            "--max-tokens",
            "4",
            "--drafter",
            drafter.to_str().unwrap(),
        ])
    };
    let f = corrupt.join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = generate_with(&corrupt);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--drafter") && err.contains("model.safetensors"),
        "{err}"
    );
    // The drafter of the small model itself works there.
    let out = generate_with(&foreign);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
