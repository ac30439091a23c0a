//! The `fsdp` trainer plugin against real torchrun + PyTorch FSDP2 (gloo, 2 ranks), loaded
//! from `libtandem_fsdp.so` through the registry like any dynamic plugin, checked against the
//! native trainer and engine, and (test `b_`) against a real vLLM server; test `d_` runs the
//! RL loop with it and SIGKILLs a torchrun rank mid-run (the loop restarts the job from its
//! checkpoint).
//!
//! Needs the venv of `scripts/setup-python.sh`: the tests that drive Python are `#[ignore]`d
//! and, when run with `--ignored`, fail at once if `TANDEM_PYTHON` is unset (never a silent
//! pass). Run:
//!
//! ```text
//! cargo build -p tandem-plugin-fsdp -p tandem-plugin-vllm
//! TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1) \
//!   cargo test -p tandem --test real -- --ignored --test-threads=1 fsdp_trainer::
//! ```

#![allow(clippy::unwrap_used)]

use crate::torchrun_fixture as fixture;

use crate::common::*;
use fixture::*;
use std::path::Path;
use std::time::Instant;
use tandem_plugin_api::{ErrorCode, LossKind, RVec, UpdateKind, UpdatePayload, WhichWeights};
use tandem_services::Services;

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
    let ck = fixture().dir.join("ck-full");
    let info = ok(t.save_checkpoint(ck.display().to_string().into()));
    assert_eq!(info.weight_version, 6);
    ok(t.train_step(train.clone()));
    ok(t.load_checkpoint(ck.display().to_string().into()));
    assert_eq!(ok(t.stats()).weight_version, 6);
    assert_eq!(logprobs(&mut t, &probe, WhichWeights::Current), trained);

    // Three more exports (v7..v9): each carries the digest of its files, `weights/` keeps
    // the two newest.
    let last = exports_carry_digests_and_keep_two(&mut t, UpdateKind::CheckpointDir, &train, 3);
    assert_eq!(last.version, 9);
}

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

    let vllm_lib = fixture().plugins.join("libtandem_vllm.so");
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

    // Three more adapter exports (v13..v15): each carries the digest of its files,
    // `adapters/` keeps the two newest.
    let last = exports_carry_digests_and_keep_two(&mut t, UpdateKind::Adapter, &train, 3);
    assert_eq!(last.version, 15);
}

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

fn d_the_native_fsdp_loop_runs_and_a_killed_rank_restarts_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "[engine]\nplugin = \"native\"",
        "[trainer]\nplugin = \"fsdp\"\n\n[trainer.options]\nranks = 2",
        "[bridge]\nmode = \"checkpoint\"\nverify = true",
    );
    // Checkpoints at steps 2, 4 and 5 (the last).
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &job,
        text.replace("seed = 0\n", "seed = 0\nsave_every = 2\n"),
    )
    .unwrap();

    // 1. Uninterrupted: every step trains and syncs; the reference of the run below.
    let start = Instant::now();
    let out = run_job(&job, STEPS);
    eprintln!(
        "fsdp loop: {STEPS} steps in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let clean = dir.path().join("run");
    let m = metrics_lines(&clean);
    assert_eq!(m.len(), STEPS as usize, "{m:?}");
    let events = std::fs::read_to_string(clean.join("events.jsonl")).unwrap();
    assert!(events.contains("sync"), "no sync event: {events}");
    // Every sync carried the fsdp export's st256 digest, verified by the native engine.
    assert_every_sync_verified(&events);
    let exported: Vec<_> = std::fs::read_dir(clean.join("weights"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let trained = versions(&m);
    assert!(
        trained.windows(2).all(|w| w[1] >= w[0]) && trained[STEPS as usize - 1] > trained[0],
        "weight versions did not go up: {trained:?}"
    );
    let last = format!("v{}", trained[STEPS as usize - 1]);
    assert!(
        exported.contains(&last),
        "the last step's checkpoint {last} was not exported: {exported:?}"
    );

    // 2. The same job (same model, same seed) with torchrun rank 0 SIGKILLed once step 3 is
    //    recorded: the checkpoint of step 2 exists, step 3's batch is trained but in no
    //    checkpoint, steps 4 and 5 remain. The plugin reports the dead job as `unavailable`;
    //    the loop restarts the trainer (a new torchrun job), loads the step-2 checkpoint,
    //    replays step 3 and goes on, with the very weights of the uninterrupted run (fsdp on
    //    the CPU is bit-exact run to run, and the checkpoint holds the optimizer state).
    let killed_run = dir.path().join("killed");
    let start = Instant::now();
    let (out, rank0) = run_killing_rank0_after(&job, &killed_run, 3);
    eprintln!(
        "fsdp loop: {STEPS} steps with rank 0 (pid {rank0}) killed in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    let km = metrics_lines(&killed_run);
    let steps: Vec<u64> = km.iter().map(|x| x["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (1..=u64::from(STEPS)).collect::<Vec<_>>(), "{km:?}");
    assert_eq!(
        versions(&km),
        trained,
        "weight versions differ from the clean run"
    );
    assert_eq!(km.last().unwrap()["restarts"].as_u64(), Some(1), "{km:?}");
    let ev = event_lines(&killed_run);
    let at = |op: &str| -> Vec<usize> { (0..ev.len()).filter(|&i| ev[i]["op"] == op).collect() };
    let (deaths, restarts) = (at("death"), at("restart"));
    assert_eq!((deaths.len(), restarts.len()), (1, 1), "{ev:?}");
    let (death, restart) = (&ev[deaths[0]], &ev[restarts[0]]);
    eprintln!("fsdp loop: {death}\nfsdp loop: {restart}");
    assert_eq!(death["target"], "trainer", "{death}");
    let why = death["detail"].as_str().unwrap();
    assert!(
        why.contains("torchrun job") && why.contains("died during"),
        "{why}"
    );
    assert_eq!(restart["target"], "trainer", "{restart}");
    let died_in = death["step"].as_u64().unwrap();
    assert!((4..u64::from(STEPS)).contains(&died_in), "{death}");
    // The newest checkpoint when the trainer died is what the new one loads; the batches
    // trained since are replayed in order, and the trainer is back at the version the run
    // had reached.
    let newest = (0..deaths[0])
        .rev()
        .find(|&i| ev[i]["op"] == "checkpoint")
        .map(|i| ev[i]["detail"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no checkpoint before the death: {ev:?}"));
    assert!(newest.ends_with("step-000002"), "{newest}");
    let loads: Vec<&str> = at("load_checkpoint")
        .into_iter()
        .filter(|&i| i > deaths[0] && i < restarts[0])
        .map(|i| ev[i]["detail"].as_str().unwrap())
        .collect();
    assert_eq!(loads.len(), 1, "{ev:?}");
    assert!(
        loads[0].starts_with(&format!("{newest} ")),
        "{loads:?} vs {newest}"
    );
    let replays: Vec<&str> = at("replay")
        .into_iter()
        .filter(|&i| i > deaths[0] && i < restarts[0])
        .map(|i| ev[i]["detail"].as_str().unwrap())
        .collect();
    assert!(
        replays == ["steps [3]"] || replays == ["steps [3,4]"],
        "{replays:?}"
    );
    let reached = (0..deaths[0])
        .rev()
        .find(|&i| ev[i]["op"] == "train")
        .map(|i| ev[i]["detail"].as_str().unwrap().to_string())
        .unwrap();
    assert!(
        restart["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("{reached} ")),
        "{restart} after {reached}"
    );
    assert!(at("recovered").iter().any(|&i| i > restarts[0]), "{ev:?}");
    let final_weights = |run: &Path| {
        std::fs::read(run.join(format!("checkpoints/step-{STEPS:06}/model.safetensors"))).unwrap()
    };
    assert!(
        final_weights(&killed_run) == final_weights(&clean),
        "the recovered run's final weights differ from the uninterrupted run's"
    );
    assert_no_leftovers(dir.path(), std::time::Duration::from_secs(30));
}

/// Steps of the loop runs of test `d_`.
const STEPS: u32 = 5;

fn versions(metrics: &[serde_json::Value]) -> Vec<u64> {
    metrics
        .iter()
        .map(|x| x["weight_version"].as_u64().unwrap())
        .collect()
}

fn event_lines(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `tandem run JOB --steps STEPS --output-dir OUT`, SIGKILLing torchrun rank 0 of its trainer
/// as soon as the metrics line of step `after` is written; the run's output and the pid
/// killed.
fn run_killing_rank0_after(job: &Path, out: &Path, after: usize) -> (std::process::Output, i32) {
    let logs = tempfile::tempdir().unwrap();
    let file = |name: &str| std::fs::File::create(logs.path().join(name)).unwrap();
    let mut child = tandem()
        .arg("run")
        .arg(job)
        .args(["--steps", &STEPS.to_string(), "--output-dir"])
        .arg(out)
        .env("TANDEM_PYTHON", python())
        .env("TANDEM_PLUGIN_PATH", &fixture().plugins)
        .stdout(file("stdout"))
        .stderr(file("stderr"))
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut killed = None;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed().as_secs() > 600 {
            let _ = child.kill();
            panic!("`tandem run` did not finish within 600 s");
        }
        let recorded = std::fs::read_to_string(out.join("metrics.jsonl"))
            .map_or(0, |t| t.matches('\n').count());
        if killed.is_none() && recorded >= after {
            let pid = torchrun_rank_pid(out, 0).expect("torchrun rank 0 of the run");
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
            killed = Some(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let read = |name: &str| std::fs::read(logs.path().join(name)).unwrap();
    let output = std::process::Output {
        status,
        stdout: read("stdout"),
        stderr: read("stderr"),
    };
    let pid = killed.unwrap_or_else(|| panic!("rank 0 was never killed: {}", stderr(&output)));
    (output, pid)
}

/// No `options.python`, no `$TANDEM_PYTHON` and no pointer file of `scripts/setup-python.sh`
/// (an empty `TANDEM_VENV_ROOT`, whatever this machine's `~/.cache/tandem` holds).
#[test]
fn a_missing_python_environment_is_one_line() {
    plugin_lib("tandem-plugin-fsdp", "libtandem_fsdp.so");
    assert_no_venv_is_one_line(
        "[trainer]\nplugin = \"fsdp\"",
        &["TANDEM_PYTHON", "setup-python.sh", "no pointer file"],
    );
}

fn f_vllm_with_the_fsdp_trainer_runs_the_lora_example() {
    short_example("vllm-fsdp-lora", 3);
}

fn g_vllm_with_the_fsdp_trainer_runs_the_checkpoint_example() {
    short_example("vllm-fsdp-checkpoint", 2);
}

/// The steps above in order (`a_missing_python_environment_is_one_line`, which needs no Python, is a test of its own).
#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real torchrun + FSDP2 and a real vLLM server"]
fn all_steps_in_order() {
    crate::common::in_order(&[
        (
            "a_full_fine_tuning_matches_native_and_its_checkpoint_serves_on_the_native_engine",
            a_full_fine_tuning_matches_native_and_its_checkpoint_serves_on_the_native_engine,
        ),
        (
            "b_the_fsdp_lora_adapter_loads_into_the_native_engine_and_real_vllm",
            b_the_fsdp_lora_adapter_loads_into_the_native_engine_and_real_vllm,
        ),
        (
            "c_python_errors_and_a_dead_rank_are_one_line",
            c_python_errors_and_a_dead_rank_are_one_line,
        ),
        (
            "d_the_native_fsdp_loop_runs_and_a_killed_rank_restarts_from_its_checkpoint",
            d_the_native_fsdp_loop_runs_and_a_killed_rank_restarts_from_its_checkpoint,
        ),
        (
            "f_vllm_with_the_fsdp_trainer_runs_the_lora_example",
            f_vllm_with_the_fsdp_trainer_runs_the_lora_example,
        ),
        (
            "g_vllm_with_the_fsdp_trainer_runs_the_checkpoint_example",
            g_vllm_with_the_fsdp_trainer_runs_the_checkpoint_example,
        ),
    ]);
}
