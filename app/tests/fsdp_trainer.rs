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

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;
use tandem_runtime::registry::Registry;
use tandem_services::Services;
use tandem_plugin_api::{
    ComponentConfig, EngineBox, ErrorCode, GenerateRequest, LossConfig, LossKind, PauseMode,
    RString, RVec, SamplingParams, TrainBatch, TrainSequence, TrainerBox, UpdateKind,
    UpdatePayload, WeightUpdate, WhichWeights,
};

const EOS: u32 = 2;

fn python() -> String {
    python_env("fsdp_trainer")
}

struct Fixture {
    dir: tempfile::TempDir,
    model: PathBuf,
    plugins: tempfile::TempDir,
}

/// Tiny model (`tandem model init`) + a plugin dir holding `libtandem_fsdp.so` and, when
/// built, `libtandem_vllm.so`.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m");
        let out = run(tandem()
            .args(["model", "init", "--preset", "tiny", "--seed", "5", "--out"])
            .arg(&model));
        assert!(out.status.success(), "{}", stderr(&out));
        let fsdp = cdylib("tandem_fsdp");
        let vllm = target_profile_dir().join("libtandem_vllm.so");
        let mut libs = vec![(fsdp.as_path(), "libtandem_fsdp.so")];
        if vllm.exists() {
            libs.push((vllm.as_path(), "libtandem_vllm.so"));
        }
        let plugins = plugin_dir(&libs);
        Fixture {
            dir,
            model,
            plugins,
        }
    })
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::discover(&[fixture().plugins.path().to_path_buf()]).unwrap())
}

fn config(component: &str, options: &str, run: &str) -> ComponentConfig {
    ComponentConfig {
        component: component.into(),
        model_path: fixture().model.display().to_string().into(),
        options_json: options.into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: fixture().dir.path().join(run).display().to_string().into(),
    }
}

fn fsdp(options: &str, run: &str) -> TrainerBox {
    let opts = format!(r#"{{"python": "{}", "ranks": 2 {options}}}"#, python());
    let mut t = registry()
        .new_trainer(config("fsdp", &opts, run), Services::new().handle())
        .unwrap();
    let start = Instant::now();
    ok(t.init());
    eprintln!("fsdp: 2 ranks up in {:.1} s", start.elapsed().as_secs_f64());
    t
}

fn native_trainer(options: &str, run: &str) -> TrainerBox {
    let mut t = registry()
        .new_trainer(config("native", options, run), Services::new().handle())
        .unwrap();
    ok(t.init());
    t
}

fn native_engine() -> EngineBox {
    registry()
        .new_engine(config("native", "", "engine"), Services::new().handle())
        .unwrap()
}

fn seq(tokens: &[u32], prompt_len: u32) -> TrainSequence {
    TrainSequence {
        tokens: tokens.to_vec().into(),
        prompt_len,
        advantage: 0.0,
        old_logprobs: RVec::new(),
        ref_logprobs: RVec::new(),
    }
}

fn batch(seqs: Vec<TrainSequence>, kind: LossKind, lr: f32) -> TrainBatch {
    TrainBatch {
        sequences: seqs.into(),
        loss: LossConfig {
            kind,
            clip_eps_low: 0.2,
            clip_eps_high: 0.2,
            kl_coef: 0.0,
            learning_rate: lr,
            grad_clip: 1.0,
        },
    }
}

/// Sequences of different lengths (an odd count, so the two ranks get unequal shares).
fn probe_tokens() -> Vec<Vec<u32>> {
    vec![
        vec![1, 40, 41, 42, 43, 44],
        vec![1, 7, 9],
        vec![1, 100, 200, 300, 400, 500, 3, 4, 5],
        vec![1, 12, 13, 14],
        vec![1, 60, 61],
    ]
}

fn probe_batch(prompt_len: u32) -> TrainBatch {
    let seqs = probe_tokens().iter().map(|t| seq(t, prompt_len)).collect();
    batch(seqs, LossKind::Sft, 1e-3)
}

fn flat(rows: &[RVec<f32>]) -> Vec<f32> {
    rows.iter().flat_map(|r| r.iter().copied()).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn metric(m: &[tandem_plugin_api::Metric], name: &str) -> f64 {
    m.iter()
        .find(|x| x.name.as_str() == name)
        .unwrap_or_else(|| panic!("no metric {name} in {m:?}"))
        .value
}

fn logprobs(t: &mut TrainerBox, b: &TrainBatch, which: WhichWeights) -> Vec<f32> {
    flat(&ok(t.compute_logprobs(b.clone(), which)))
}

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
    let first = metric(&ok(t.train_step(train.clone())), "loss");
    let mut last = first;
    for _ in 0..4 {
        last = metric(&ok(t.train_step(train.clone())), "loss");
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
    assert!(metric(&m, "kl") > 0.0, "{m:?}");
    assert_eq!(metric(&m, "applied"), 1.0);

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

fn greedy(prompt: &[u32], adapter: Option<&str>) -> GenerateRequest {
    GenerateRequest {
        prompts: vec![RVec::from(prompt.to_vec())].into(),
        sampling: SamplingParams {
            temperature: 0.0,
            max_tokens: 6,
            stop_token_ids: vec![EOS].into(),
            logprobs: true,
            ..SamplingParams::default()
        },
        adapter: adapter.map(RString::from).into(),
    }
}

/// The engine's greedy completion with `adapter`, and the trainer's logprobs of it.
fn engine_vs_trainer(e: &EngineBox, t: &mut TrainerBox, adapter: &str) -> (Vec<u32>, f32) {
    let prompt = [1u32, 40, 41, 42];
    let r = ok(e.generate(greedy(&prompt, Some(adapter))));
    let c = &r.completions[0];
    let mut full = prompt.to_vec();
    full.extend(c.tokens.iter());
    let b = batch(vec![seq(&full, prompt.len() as u32)], LossKind::Sft, 1e-3);
    let ours = logprobs(t, &b, WhichWeights::Current);
    (c.tokens.to_vec(), max_diff(&c.logprobs, &ours))
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
        lp_before.push(metric(&m, "nll"));
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
    let pid = ok(t.stats())
        .metrics
        .iter()
        .find(|m| m.name.as_str() == "rank0_pid")
        .unwrap()
        .value as i32;
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
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

/// A job file for `tandem run` with `engine` / `trainer` / `bridge` sections, on a tiny model
/// the run creates and warm-starts (so GRPO groups have mixed rewards and steps train).
fn job(dir: &Path, engine: &str, trainer: &str, bridge: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "fsdp-loop"
output_dir = "{out}"
steps = 2
seed = 0

[placement]
mode = "disaggregated"
devices = ["cpu"]

[model]
path = "{model}"
init_preset = "tiny"
warm_start_steps = 40

{engine}

{trainer}

{bridge}

[algorithm]
name = "grpo"
prompts_per_step = 4
group_size = 4
max_tokens = 4
temperature = 1.0
learning_rate = 0.0003
clip_eps = 0.2
kl_coef = 0.0

[task]
kind = "arithmetic"

[task.options]
max_operand = 3
reward = "exact"
"#,
        out = dir.join("run").display(),
        model = dir.join("model").display(),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn metrics_lines(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn run_job(job: &Path, steps: u32) -> std::process::Output {
    run(tandem()
        .arg("run")
        .arg(job)
        .args(["--steps", &steps.to_string()])
        .env("TANDEM_PYTHON", python())
        .env("TANDEM_PLUGIN_PATH", fixture().plugins.path()))
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
    let dir = tempfile::tempdir().unwrap();
    let no_venv = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "[engine]\nplugin = \"native\"",
        "[trainer]\nplugin = \"fsdp\"",
        "[bridge]\nmode = \"checkpoint\"\nverify = false",
    );
    let out = run(tandem()
        .arg("run")
        .arg(&job)
        .env_remove("TANDEM_PYTHON")
        .env("TANDEM_VENV_ROOT", no_venv.path())
        .env("TANDEM_PLUGIN_PATH", fixture().plugins.path()));
    assert!(!out.status.success());
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{}", stderr(&out));
    for want in ["TANDEM_PYTHON", "setup-python.sh", "no pointer file"] {
        assert!(lines[0].contains(want), "`{want}` missing: {}", lines[0]);
    }
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

/// Runs a short version of `examples/<name>.toml` (copied under a scratch dir so the model it
/// creates and warm-starts lands there) and checks every step trained and synced.
fn short_example(name: &str, steps: u32) {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    let job = jobs.join(format!("{name}.toml"));
    std::fs::copy(workspace_root().join(format!("examples/{name}.toml")), &job).unwrap();
    assert!(
        fixture().plugins.path().join("libtandem_vllm.so").exists(),
        "build the vllm plugin first: cargo build -p tandem-plugin-vllm"
    );
    let out_dir = dir.path().join("run");
    let start = Instant::now();
    let out = run(tandem()
        .arg("run")
        .arg(&job)
        .args(["--steps", &steps.to_string(), "--output-dir"])
        .arg(&out_dir)
        .env("TANDEM_PYTHON", python())
        .env("TANDEM_PLUGIN_PATH", fixture().plugins.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!(
        "{name}: {steps} steps in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let m = metrics_lines(&out_dir);
    assert_eq!(m.len(), steps as usize, "{m:?}");
    let versions: Vec<u64> = m
        .iter()
        .map(|x| x["weight_version"].as_u64().unwrap())
        .collect();
    assert!(
        versions.windows(2).all(|w| w[1] > w[0]),
        "every step should train and sync a new version: {versions:?}"
    );
    let events = std::fs::read_to_string(out_dir.join("events.jsonl")).unwrap();
    let last = format!(
        "\"op\":\"sync\",\"detail\":\"version {}",
        versions[versions.len() - 1]
    );
    assert!(
        events.contains(&last),
        "no sync of the last version: {events}"
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

/// Applies an update the way the contract allows: paused, then serving again.
fn apply_paused(e: &EngineBox, update: WeightUpdate) -> tandem_plugin_api::UpdateReport {
    ok(e.pause_generation(PauseMode::Wait));
    let report = ok(e.apply_weight_update(update));
    ok(e.continue_generation());
    report
}
