//! The `fsdp` trainer plugin against real torchrun + PyTorch FSDP2 (gloo, 2 ranks), loaded
//! from `libtandem_fsdp.so` through the registry like any dynamic plugin, checked against the
//! native trainer and engine, and (test `b_`) against a real vLLM server.
//!
//! Needs the venv of `scripts/setup-python.sh`: the tests that drive Python are `#[ignore]`d
//! and, when run with `--ignored`, fail at once if `TANDEM_PYTHON` is unset (never a silent
//! pass). Run:
//!
//! ```text
//! cargo build -p tandem-plugin-fsdp -p tandem-plugin-vllm
//! TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1) \
//!   cargo test -p tandem --test fsdp_trainer -- --ignored --test-threads=1
//! ```

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../torchrun_fixture/mod.rs"]
mod fixture;

use common::*;
use fixture::*;
use std::path::Path;
use std::time::Instant;
use tandem_plugin_api::{ErrorCode, LossKind, RVec, UpdateKind, UpdatePayload, WhichWeights};
use tandem_services::Services;

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real torchrun + FSDP2"]
fn a_full_fine_tuning_matches_native_and_its_checkpoint_serves_on_the_native_engine() {
    let mut t = fsdp("", "full");
    let probe = probe_batch(1);
    let ours = logprobs(&mut t, &probe, WhichWeights::Current);
    let mut native = native_trainer("", "native-full");
    let theirs = logprobs(&mut native, &probe, WhichWeights::Current);
    let d = max_diff(&ours, &theirs);
    eprintln!("fsdp vs native trainer logprobs: max |Δ| {d:.2e}");
    assert!(d <= 1e-4, "fsdp vs native logprobs differ by {d}");

    // SFT on one sequence: the loss falls; `ref` keeps the starting weights.
    ok(t.snapshot("ref".into()));
    let train = batch(
        vec![seq(&[1, 40, 41, 42, 43, 44, 45, 2], 2)],
        LossKind::Sft,
        1e-2,
    );
    let first = metric_value(&ok(t.train_step(train.clone())), "loss");
    let mut last = first;
    for _ in 0..4 {
        last = metric_value(&ok(t.train_step(train.clone())), "loss");
    }
    assert!(
        last < first * 0.8,
        "SFT loss did not fall: {first} -> {last}"
    );
    assert_eq!(ok(t.stats()).weight_version, 5);
    let as_ref = logprobs(&mut t, &probe, WhichWeights::Snapshot("ref".into()));
    assert_eq!(
        as_ref, ours,
        "the `ref` snapshot must give the starting logprobs"
    );
    let now = logprobs(&mut t, &probe, WhichWeights::Current);
    assert!(max_diff(&now, &ours) > 1e-3, "training changed nothing");

    // GRPO with a KL term against `ref`.
    let mut g = batch(
        probe_tokens().iter().map(|x| seq(x, 2)).collect(),
        LossKind::Grpo,
        1e-3,
    );
    g.loss.kl_coef = 0.1;
    let refs = ok(t.compute_logprobs(g.clone(), WhichWeights::Snapshot("ref".into())));
    for (i, (s, r)) in g.sequences.iter_mut().zip(refs).enumerate() {
        s.advantage = if i % 2 == 0 { 1.0 } else { -1.0 };
        s.ref_logprobs = r;
    }
    let m = ok(t.train_step(g));
    assert!(metric_value(&m, "kl") > 0.0, "{m:?}");
    assert_eq!(metric_value(&m, "applied"), 1.0);

    // The checkpoint export, served by the native engine: same logprobs.
    let update = ok(t.export_weight_update(UpdateKind::CheckpointDir));
    assert_eq!(update.version, 6);
    let UpdatePayload::CheckpointDir { dir } = &update.payload else {
        panic!("{update:?}")
    };
    assert!(Path::new(dir.as_str()).join("model.safetensors").is_file());
    let engine = native_engine();
    apply_paused(&engine, update.clone());
    assert_eq!(ok(engine.health()).weight_version, 6);
    let trained = logprobs(&mut t, &probe, WhichWeights::Current);
    let seqs: RVec<RVec<u32>> = probe_tokens().into_iter().map(RVec::from).collect();
    let served = flat(&ok(engine.score(seqs)));
    let d = max_diff(&served, &trained);
    eprintln!("native engine on the fsdp checkpoint vs fsdp trainer: max |Δ| {d:.2e}");
    assert!(d <= 1e-4, "engine vs trainer differ by {d}");

    // save → train → load brings back the saved weights and version.
    let ck = fixture().dir.path().join("ck-full");
    let info = ok(t.save_checkpoint(ck.display().to_string().into()));
    assert_eq!(info.weight_version, 6);
    ok(t.train_step(train));
    ok(t.load_checkpoint(ck.display().to_string().into()));
    assert_eq!(ok(t.stats()).weight_version, 6);
    assert_eq!(logprobs(&mut t, &probe, WhichWeights::Current), trained);
}

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real torchrun + FSDP2 and a real vLLM server"]
fn b_the_fsdp_lora_adapter_loads_into_the_native_engine_and_real_vllm() {
    let mut t = fsdp(r#", "lora": {"rank": 8, "alpha": 16, "seed": 3}"#, "lora");
    // B starts at zero: the adapter changes nothing until trained.
    let train = batch(
        vec![seq(&[1, 40, 41, 42, 9, 9, 9, 2], 4)],
        LossKind::Sft,
        2e-2,
    );
    for _ in 0..6 {
        ok(t.train_step(train.clone()));
    }
    let update = ok(t.export_weight_update(UpdateKind::Adapter));
    let UpdatePayload::Adapter { name, dir } = &update.payload else {
        panic!("{update:?}")
    };
    assert_eq!(name.as_str(), "fsdp-v6");
    let e = err(t.export_weight_update(UpdateKind::CheckpointDir));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");

    let engine = native_engine();
    ok(engine.load_adapter(name.clone(), dir.clone()));
    let (native_tokens, d) = engine_vs_trainer(&engine, &mut t, name.as_str());
    eprintln!("native engine with the fsdp adapter vs trainer: max |Δ| {d:.2e}");
    assert!(d <= 1e-4, "native engine vs trainer differ by {d}");

    let vllm_lib = fixture().plugins.path().join("libtandem_vllm.so");
    assert!(
        vllm_lib.exists(),
        "build the vllm plugin first: cargo build -p tandem-plugin-vllm"
    );
    let opts = format!(
        r#"{{"python": "{}", "max_model_len": 256, "enable_lora": true, "max_lora_rank": 8,
            "request_timeout_s": 120, "control_timeout_s": 60}}"#,
        python()
    );
    let vllm = registry()
        .new_engine(config("vllm", &opts, "vllm"), Services::new().handle())
        .unwrap();
    let start = Instant::now();
    ok(vllm.start());
    eprintln!("vllm: up in {:.1} s", start.elapsed().as_secs_f64());
    let base = ok(vllm.generate(greedy(&[1, 40, 41, 42], None)));
    ok(vllm.load_adapter(name.clone(), dir.clone()));
    let (tokens, d) = engine_vs_trainer(&vllm, &mut t, name.as_str());
    eprintln!("vLLM with the fsdp adapter vs trainer: max |Δ| {d:.2e}");
    assert!(d <= 1e-3, "vLLM vs trainer differ by {d}");
    assert_eq!(tokens, native_tokens);
    assert_ne!(
        base.completions[0].tokens.to_vec(),
        tokens,
        "the adapter did not change vLLM's output"
    );
    ok(vllm.unload_adapter(name.clone()));

    // The bridge's path: a newer adapter through apply_weight_update (load under its versioned
    // name, switch, unload the previous) is what vLLM then serves.
    let mut lp_before = Vec::new();
    for _ in 0..6 {
        let m = ok(t.train_step(train.clone()));
        lp_before.push(metric_value(&m, "nll"));
    }
    let newer = ok(t.export_weight_update(UpdateKind::Adapter));
    let UpdatePayload::Adapter {
        name: newer_name, ..
    } = &newer.payload
    else {
        panic!("{newer:?}")
    };
    assert_eq!(newer_name.as_str(), "fsdp-v12");
    apply_paused(&vllm, newer.clone());
    assert_eq!(ok(vllm.health()).weight_version, 12);
    let (_, d) = engine_vs_trainer(&vllm, &mut t, newer_name.as_str());
    eprintln!(
        "vLLM after the bridge's adapter swap vs trainer: max |Δ| {d:.2e} (nll {lp_before:?})"
    );
    assert!(d <= 1e-3, "vLLM serves a stale adapter after the swap: {d}");
    ok(vllm.shutdown());
}

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real torchrun + FSDP2"]
fn c_python_errors_and_a_dead_rank_are_one_line() {
    let mut t = fsdp("", "errors");
    // A Python exception: the op, the rank, the exception and where it was raised.
    let e = err(t.train_step(batch(vec![seq(&[1, 2], 5)], LossKind::Sft, 1e-3)));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
    for want in [
        "train_step failed on rank",
        "ValueError",
        "prompt_len 5",
        "[at File",
    ] {
        assert!(e.message.contains(want), "`{want}` missing from: {e}");
    }
    assert!(!e.message.contains('\n'), "not one line: {e}");
    let e = err(t.restore("nope".into()));
    assert!(e.message.contains("no snapshot named `nope`"), "{e}");
    // The trainer still serves after errors.
    ok(t.compute_logprobs(probe_batch(1), WhichWeights::Current));

    // A rank dies: the next call fails with one line naming the job, and so does every later
    // call (no hang).
    kill_rank0(&t);
    let start = Instant::now();
    let e = err(t.compute_logprobs(probe_batch(1), WhichWeights::Current));
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    for want in ["torchrun job", "died during compute_logprobs", "log:"] {
        assert!(e.message.contains(want), "`{want}` missing from: {e}");
    }
    assert!(!e.message.contains('\n'), "not one line: {e}");
    assert!(
        start.elapsed().as_secs() < 60,
        "noticing the death took too long"
    );
    let again = err(t.train_step(probe_batch(1)));
    assert_eq!(again.message, e.message);
}

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real torchrun + FSDP2"]
fn d_native_engine_with_the_fsdp_trainer_runs_the_loop_over_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "[engine]\nplugin = \"native\"",
        "[trainer]\nplugin = \"fsdp\"\n\n[trainer.options]\nranks = 2",
        "[bridge]\nmode = \"checkpoint\"\nverify = false",
    );
    let out = run_job(&job, 3);
    assert!(out.status.success(), "{}", stderr(&out));
    let m = metrics_lines(&dir.path().join("run"));
    assert_eq!(m.len(), 3, "{m:?}");
    let events = std::fs::read_to_string(dir.path().join("run/events.jsonl")).unwrap();
    assert!(events.contains("sync"), "no sync event: {events}");
    let weights = dir.path().join("run/weights");
    let exported: Vec<_> = std::fs::read_dir(&weights)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let trained: Vec<u64> = m
        .iter()
        .map(|x| x["weight_version"].as_u64().unwrap())
        .collect();
    assert!(
        trained.windows(2).all(|w| w[1] >= w[0]) && trained[2] > trained[0],
        "weight versions did not go up: {trained:?}"
    );
    let last = format!("v{}", trained[2]);
    assert!(
        exported.contains(&last),
        "the last step's checkpoint {last} was not exported: {exported:?}"
    );
}

/// No `options.python`, no `$TANDEM_PYTHON` and no pointer file of `scripts/setup-python.sh`
/// (an empty `TANDEM_VENV_ROOT`, whatever this machine's `~/.cache/tandem` holds).
#[test]
fn e_a_missing_python_environment_is_one_line() {
    plugin_lib("tandem-plugin-fsdp", "libtandem_fsdp.so");
    assert_no_venv_is_one_line(
        "[trainer]\nplugin = \"fsdp\"",
        &["TANDEM_PYTHON", "setup-python.sh", "no pointer file"],
    );
}

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real torchrun + FSDP2 and a real vLLM server"]
fn f_vllm_with_the_fsdp_trainer_runs_the_lora_example() {
    short_example("vllm-fsdp-lora", 3);
}

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real torchrun + FSDP2 and a real vLLM server"]
fn g_vllm_with_the_fsdp_trainer_runs_the_checkpoint_example() {
    short_example("vllm-fsdp-checkpoint", 2);
}
