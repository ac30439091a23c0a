//! Checkpoints through `tandem run`: a run stopped at a checkpoint and resumed trains bit for
//! bit as one that never stopped (full fine-tuning over `ipc`, LoRA over `lora`: the AdamW
//! moments travel in the checkpoint); `--resume` skips a newest checkpoint whose file was cut
//! short or had a byte changed (one warning naming the file) and continues from the older one;
//! when no checkpoint is valid it stops with one error line and leaves the run directory as
//! it was.

#![allow(clippy::unwrap_used)]

use crate::common::rl::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Four steps, a checkpoint every two, on `bridge` (LoRA with `lora`), from the warm-started
/// model: with these prompts and rates steps 3 and 4 both train in either mode (seeded rollouts),
/// so step 3 starts from the moments step 2 left.
fn job(t: &Scratch, bridge: &str) -> PathBuf {
    let lora = bridge == "lora";
    t.job(&JobOpts {
        steps: 4,
        save_every: 2,
        prompts: if lora { 4 } else { 2 },
        group: 4,
        max_tokens: 4,
        bridge: bridge.into(),
        learning_rate: if lora { 1e-2 } else { 1e-3 },
        extra_trainer: if lora {
            "[trainer.options.lora]\nrank = 4\nalpha = 8\n".into()
        } else {
            String::new()
        },
        ..JobOpts::default()
    })
}

/// `tandem run JOB --output-dir DIR <extra>`, which must succeed.
fn run_ok(t: &Scratch, job: &Path, dir: &Path, extra: &[&str]) {
    let mut args = vec!["--output-dir", dir.to_str().unwrap()];
    args.extend(extra);
    let out = t.run(job, &args);
    assert!(out.status.success(), "{}", out.stderr_text());
}

/// `tandem run --resume DIR --steps 4`.
fn resume(t: &Scratch, dir: &Path) -> std::process::Output {
    t.tandem(&["run", "--resume", dir.to_str().unwrap(), "--steps", "4"])
}

/// Every file under `dir` (relative path -> contents).
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The trainer's files of a checkpoint: its parameters, moments and trainer state.
fn trainer_files(checkpoint: &Path) -> BTreeMap<String, Vec<u8>> {
    let names = [
        "model.safetensors",
        "adapter_model.safetensors",
        "optimizer.safetensors",
        "tandem_trainer_state.json",
    ];
    let files: BTreeMap<String, Vec<u8>> = names
        .iter()
        .filter_map(|n| Some((n.to_string(), std::fs::read(checkpoint.join(n)).ok()?)))
        .collect();
    assert_eq!(
        files.len(),
        3,
        "{}: {:?}",
        checkpoint.display(),
        files.keys()
    );
    files
}

/// The lines of a run's `metrics.jsonl`.
fn metrics(run: &Path) -> Vec<serde_json::Value> {
    json_lines(&run.join("metrics.jsonl"))
}

/// What each step measured that depends on the weights, not on timing.
fn figures(run: &Path) -> Vec<String> {
    metrics(run)
        .iter()
        .map(|m| {
            let keys = [
                "step",
                "reward_mean",
                "exact_frac",
                "loss",
                "grad_norm",
                "train_sequences",
                "weight_version",
            ];
            keys.iter()
                .map(|k| m[*k].to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Four steps straight and two steps then `--resume --steps 4` end with byte-identical
/// trainer files and the same figures for every step.
fn resumed_run_is_bit_exact(bridge: &str) {
    let t = Scratch::warm();
    let job = job(&t, bridge);
    let (straight, split) = (t.dir.join("straight"), t.dir.join("split"));
    run_ok(&t, &job, &straight, &[]);
    run_ok(&t, &job, &split, &["--steps", "2"]);
    let out = resume(&t, &split);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        !out.stderr_text().contains("skipping checkpoint"),
        "{}",
        out.stderr_text()
    );
    let last = |run: &Path| trainer_files(&run.join("checkpoints/step-000004"));
    let (a, b) = (last(&straight), last(&split));
    for (name, bytes) in &a {
        assert!(b[name] == *bytes, "{name} differs after the resume");
    }
    // The run trained: the moments are not zero, and step 4's weights are not step 2's.
    let params = a.keys().find(|k| k.ends_with("model.safetensors")).unwrap();
    let at2 = trainer_files(&straight.join("checkpoints/step-000002"));
    assert!(at2[params] != a[params], "steps 3 and 4 changed nothing");
    assert!(a["optimizer.safetensors"][100..].iter().any(|b| *b != 0));
    assert_eq!(figures(&straight), figures(&split));
    let trained = |m: &serde_json::Value| m["train_sequences"].as_u64().unwrap() > 0;
    let metrics = metrics(&split);
    assert!(metrics.len() == 4 && trained(&metrics[2]), "{metrics:?}");
}

#[test]
fn a_resumed_full_fine_tune_is_bit_exact() {
    resumed_run_is_bit_exact("ipc");
}

#[test]
fn a_resumed_lora_run_is_bit_exact() {
    resumed_run_is_bit_exact("lora");
}

#[test]
fn resume_skips_corrupt_checkpoints_and_refuses_when_none_is_valid() {
    let t = Scratch::warm();
    let job = job(&t, "ipc");
    let run = t.dir.join("run");
    run_ok(&t, &job, &run, &[]);
    let (ck2, ck4) = (
        run.join("checkpoints/step-000002"),
        run.join("checkpoints/step-000004"),
    );
    assert!(ck4.join("tandem_manifest.json").is_file());
    let original = trainer_files(&ck4);

    // The newest model file cut short: skipped with a warning naming it, the run continues
    // from step 2 and writes step 4 again, as it was.
    let model = ck4.join("model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let warned = |out: &std::process::Output, file: &str| {
        assert!(out.status.success(), "{}", out.stderr_text());
        let err = out.stderr_text();
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("skipping checkpoint"))
            .collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].contains("step-000004")
                && lines[0].contains(file)
                && lines[0]
                    .split("resuming from")
                    .nth(1)
                    .is_some_and(|older| older.contains("step-000002")),
            "{err}"
        );
    };
    warned(&resume(&t, &run), "model.safetensors is");
    assert!(
        trainer_files(&ck4) == original,
        "step 4 trained again differs"
    );

    // One byte of the newest optimizer file changed, the size kept: the same.
    let opt = ck4.join("optimizer.safetensors");
    let mut bytes = std::fs::read(&opt).unwrap();
    let at = bytes.len() - 5;
    bytes[at] ^= 0x40;
    std::fs::write(&opt, &bytes).unwrap();
    warned(
        &resume(&t, &run),
        "optimizer.safetensors does not match its digest",
    );
    assert!(
        trainer_files(&ck4) == original,
        "step 4 trained again differs"
    );
    let steps = steps_of(&metrics(&run));
    assert_eq!(steps, [1, 2, 3, 4]);

    // Every checkpoint corrupt: one error line naming both, nothing in the run changed.
    for ck in [&ck2, &ck4] {
        let model = ck.join("model.safetensors");
        let mut bytes = std::fs::read(&model).unwrap();
        bytes[200] ^= 0x01;
        std::fs::write(&model, &bytes).unwrap();
    }
    let before = tree(&run);
    let out = resume(&t, &run);
    assert!(!out.status.success());
    let err = out.stderr_text();
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("no checkpoint of the run is valid")
            && errors[0].contains("step-000002")
            && errors[0].contains("step-000004"),
        "{err}"
    );
    assert!(!err.contains("skipping checkpoint"), "{err}");
    let after = tree(&run);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &before {
        assert!(after[name] == *bytes, "{name} changed");
    }
}
