//! Model directories Tandem writes are complete (`tandem_model::companion`): a run's
//! checkpoints, its `checkpoint` bridge outputs, a warm start and a `--resume` source carry
//! the tokenizer files and generation config of the job's model, and `tandem generate
//! --prompt` works on them as they are; a LoRA run's checkpoint (a PEFT adapter dir) merges
//! with `tandem model merge-lora` into a model that generates what base + adapter generate.
//! The same checkpoints in transformers and real vLLM: `vllm_engine`'s
//! `d_checkpoint_reload_in_place_and_restart_both_serve_the_checkpoint`.

#![allow(clippy::unwrap_used)]

use crate::common::rl::*;
use std::path::Path;
use tandem_model::companion::missing;

const PROMPT_IDS: &str = "1,40,41,42";

/// `tandem generate --json <args>` in `t`, which must succeed.
fn generate(t: &Scratch, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["generate", "--json", "--max-tokens", "6"];
    all.extend(args);
    let out = t.tandem(&all);
    assert!(out.status.success(), "{}", out.stderr_text());
    serde_json::from_str(out.stdout_text().trim()).unwrap()
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn assert_complete(dir: &Path) {
    assert!(
        missing(dir).is_empty(),
        "{} lacks {:?}",
        dir.display(),
        missing(dir)
    );
}

#[test]
fn a_full_run_writes_complete_checkpoints_that_generate_from_a_prompt() {
    // `Scratch::warm` runs `tandem model sft`: its output is complete too.
    let t = Scratch::warm();
    assert_complete(&t.dir.join("model"));
    let job = t.job(&JobOpts {
        steps: 2,
        save_every: 1,
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let run = t.dir.join("run");
    let ck = run.join("checkpoints/step-000002");
    assert_complete(&ck);
    assert!(ck.join("model.safetensors").is_file());
    // The `checkpoint` bridge's outputs, which the engines restarted on.
    let weights: Vec<_> = std::fs::read_dir(run.join("weights"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with('v'))
        .collect();
    assert!(!weights.is_empty());
    for w in &weights {
        assert_complete(w);
    }
    let ck_s = ck.to_str().unwrap();
    let g = generate(
        &t,
        &["--model", ck_s, "--prompt", "Q: 1+2=? A:", "--greedy"],
    );
    assert!(g["text"].is_string(), "{g}");
    assert!(!g["prompt_ids"].as_array().unwrap().is_empty());

    // `--resume` completes a checkpoint written without the companion files (one that old
    // has no manifest either: with one, the missing files would fail its checks).
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "tandem_manifest.json",
    ] {
        std::fs::remove_file(ck.join(f)).unwrap();
    }
    let out = t.tandem(&["run", "--resume", run.to_str().unwrap(), "--steps", "3"]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(!out.stderr_text().contains("skipping checkpoint"));
    assert_complete(&ck);
    assert_complete(&run.join("checkpoints/step-000003"));
}

#[test]
fn a_lora_checkpoint_merges_into_a_model_that_generates_like_base_plus_adapter() {
    let t = Scratch::warm();
    let job = t.job(&JobOpts {
        steps: 2,
        bridge: "lora".into(),
        extra_trainer: "[trainer.options.lora]\nrank = 4\nalpha = 8\n".into(),
        learning_rate: 2e-2,
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let adapter = t.dir.join("run/checkpoints/step-000002");
    assert!(adapter.join("adapter_config.json").is_file());
    // A PEFT dir with the tokenizer: AutoTokenizer loads the adapter dir as it is.
    assert_complete(&adapter);

    let (base, merged) = (t.dir.join("model"), t.dir.join("merged"));
    let (base_s, adapter_s, merged_s) = (
        base.to_str().unwrap(),
        adapter.to_str().unwrap(),
        merged.to_str().unwrap(),
    );
    let out = t.tandem(&[
        "model",
        "merge-lora",
        "--base",
        base_s,
        "--adapter",
        adapter_s,
        "--out",
        merged_s,
    ]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        out.stdout_text().contains("weights merged"),
        "{}",
        out.stdout_text()
    );
    assert_complete(&merged);

    let ids = ["--prompt-ids", PROMPT_IDS, "--greedy"];
    let with_adapter = generate(
        &t,
        &[&["--model", base_s, "--adapter", adapter_s], &ids[..]].concat(),
    );
    let plain = generate(&t, &[&["--model", base_s], &ids[..]].concat());
    let m = generate(&t, &[&["--model", merged_s, "--score"], &ids[..]].concat());
    assert_eq!(
        m["tokens"], with_adapter["tokens"],
        "merged vs base + adapter tokens"
    );
    let d = max_diff(&floats(&m["logprobs"]), &floats(&with_adapter["logprobs"]));
    eprintln!("merge-lora: max |logprob(merged) - logprob(base + adapter)| = {d:e}");
    assert!(d <= 1e-4, "{d}");
    // The adapter matters, and the merged model's score agrees with its own generation.
    let from_base = if m["tokens"] == plain["tokens"] {
        max_diff(&floats(&m["logprobs"]), &floats(&plain["logprobs"]))
    } else {
        f64::INFINITY
    };
    assert!(from_base > 1e-3, "the adapter changed nothing: {from_base}");
    let (score, lp) = (floats(&m["score"]), floats(&m["logprobs"]));
    let n = m["prompt_ids"].as_array().unwrap().len();
    assert!(max_diff(&score[n - 1..], &lp) <= 1e-4);

    // Refusals are one line, exit 2, and write nothing: a taken --out, a model as adapter.
    let out = t.tandem(&[
        "model",
        "merge-lora",
        "--base",
        base_s,
        "--adapter",
        adapter_s,
        "--out",
        merged_s,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr_text());
    let err = out.stderr_text();
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("not an empty directory") && err.contains("--out"),
        "{err}"
    );
    let other = t.dir.join("other");
    let out = t.tandem(&[
        "model",
        "merge-lora",
        "--base",
        base_s,
        "--adapter",
        base_s,
        "--out",
        other.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr_text());
    assert!(
        out.stderr_text().contains("adapter_config.json"),
        "{}",
        out.stderr_text()
    );
    assert!(!other.exists());
}
