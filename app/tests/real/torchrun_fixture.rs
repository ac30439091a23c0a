//! Fixtures and helpers of the torchrun trainer tests (`fsdp_trainer`, `megatron_trainer`):
//! one tiny model, a plugin directory with the trainer libraries that are built, the native
//! trainer and engine as references, batches, job files.

#![allow(dead_code)]

use crate::common::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;
use tandem_plugin_api::files::digest::digest_dir;
use tandem_plugin_api::files::state::saved_version;
use tandem_plugin_api::{
    ComponentConfig, EngineBox, GenerateRequest, LossKind, PauseMode, RString, RVec,
    SamplingParams, TrainBatch, TrainSequence, TrainerBox, UpdateKind, UpdatePayload, WeightUpdate,
    WhichWeights,
};
use tandem_runtime::registry::Registry;
use tandem_services::Services;

pub(crate) const EOS: u32 = 2;

pub(crate) fn python() -> String {
    python_env("fsdp_trainer (or megatron_trainer)")
}

/// Tiny model (`tandem model init`) + a plugin dir holding the built ones of
/// `libtandem_fsdp.so`, `libtandem_megatron.so` and `libtandem_vllm.so` (a test of one of them
/// asserts it is there: [`plugin_lib`]).
pub(crate) fn fixture() -> &'static ModelFixture {
    static F: OnceLock<ModelFixture> = OnceLock::new();
    F.get_or_init(|| {
        let built: Vec<(PathBuf, &str)> = [
            "libtandem_fsdp.so",
            "libtandem_megatron.so",
            "libtandem_vllm.so",
        ]
        .into_iter()
        .map(|name| (target_profile_dir().join(name), name))
        .filter(|(p, _)| p.exists())
        .collect();
        let libs: Vec<(&Path, &str)> = built.iter().map(|(p, n)| (p.as_path(), *n)).collect();
        model_fixture(5, &libs)
    })
}

/// Asserts that the plugin library of `crate_name` is in the fixture's plugin dir.
pub(crate) fn plugin_lib(crate_name: &str, lib: &str) {
    assert!(
        fixture().plugins.join(lib).exists(),
        "build the plugin first: cargo build -p {crate_name}"
    );
}

pub(crate) fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| discover(&fixture().plugins))
}

pub(crate) fn config(component: &str, options: &str, run: &str) -> ComponentConfig {
    let f = fixture();
    cpu_config(component, &f.model, options, &f.dir.join(run))
}

pub(crate) fn fsdp(options: &str, run: &str) -> TrainerBox {
    plugin_lib("tandem-plugin-fsdp", "libtandem_fsdp.so");
    let opts = format!(r#"{{"python": "{}", "ranks": 2 {options}}}"#, python());
    let mut t = registry()
        .new_trainer(config("fsdp", &opts, run), Services::new().handle())
        .unwrap();
    let start = Instant::now();
    ok(t.init());
    eprintln!("fsdp: 2 ranks up in {:.1} s", start.elapsed().as_secs_f64());
    t
}

pub(crate) fn native_trainer(options: &str, run: &str) -> TrainerBox {
    let mut t = registry()
        .new_trainer(config("native", options, run), Services::new().handle())
        .unwrap();
    ok(t.init());
    t
}

pub(crate) fn native_engine() -> EngineBox {
    registry()
        .new_engine(config("native", "", "engine"), Services::new().handle())
        .unwrap()
}

pub(crate) fn batch(seqs: Vec<TrainSequence>, kind: LossKind, lr: f32) -> TrainBatch {
    batch_of(seqs, kind, lr)
}

/// Sequences of different lengths (an odd count, so the two ranks get unequal shares).
pub(crate) fn probe_tokens() -> Vec<Vec<u32>> {
    vec![
        vec![1, 40, 41, 42, 43, 44],
        vec![1, 7, 9],
        vec![1, 100, 200, 300, 400, 500, 3, 4, 5],
        vec![1, 12, 13, 14],
        vec![1, 60, 61],
    ]
}

pub(crate) fn probe_batch(prompt_len: u32) -> TrainBatch {
    let seqs = probe_tokens().iter().map(|t| seq(t, prompt_len)).collect();
    batch(seqs, LossKind::Sft, 1e-3)
}

pub(crate) fn flat(rows: &[RVec<f32>]) -> Vec<f32> {
    rows.iter().flat_map(|r| r.iter().copied()).collect()
}

pub(crate) fn logprobs(t: &mut TrainerBox, b: &TrainBatch, which: WhichWeights) -> Vec<f32> {
    flat(&ok(t.compute_logprobs(b.clone(), which)))
}

pub(crate) fn greedy(prompt: &[u32], adapter: Option<&str>) -> GenerateRequest {
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
pub(crate) fn engine_vs_trainer(
    e: &EngineBox,
    t: &mut TrainerBox,
    adapter: &str,
) -> (Vec<u32>, f32) {
    let prompt = [1u32, 40, 41, 42];
    let r = ok(e.generate(greedy(&prompt, Some(adapter))));
    let c = &r.completions[0];
    let mut full = prompt.to_vec();
    full.extend(c.tokens.iter());
    let b = batch(vec![seq(&full, prompt.len() as u32)], LossKind::Sft, 1e-3);
    let ours = logprobs(t, &b, WhichWeights::Current);
    (c.tokens.to_vec(), max_diff(&c.logprobs, &ours))
}

/// A job file for `tandem run` with `engine` / `trainer` / `bridge` sections, on a tiny model
/// the run creates and warm-starts (so GRPO groups have mixed rewards and steps train).
pub(crate) fn job(dir: &Path, engine: &str, trainer: &str, bridge: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "trainer-loop"
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

pub(crate) fn metrics_lines(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(crate) fn run_job(job: &Path, steps: u32) -> std::process::Output {
    run(tandem()
        .arg("run")
        .arg(job)
        .args(["--steps", &steps.to_string()])
        .env("TANDEM_PYTHON", python())
        .env("TANDEM_PLUGIN_PATH", &fixture().plugins))
}

/// Runs a short version of `examples/<name>.toml` (copied under a scratch dir so the model it
/// creates and warm-starts lands there) and checks every step trained and synced.
pub(crate) fn short_example(name: &str, steps: u32) {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    let job = jobs.join(format!("{name}.toml"));
    std::fs::copy(workspace_root().join(format!("examples/{name}.toml")), &job).unwrap();
    plugin_lib("tandem-plugin-vllm", "libtandem_vllm.so");
    let out_dir = dir.path().join("run");
    let start = Instant::now();
    let out = run(tandem()
        .arg("run")
        .arg(&job)
        .args(["--steps", &steps.to_string(), "--output-dir"])
        .arg(&out_dir)
        .env("TANDEM_PYTHON", python())
        .env("TANDEM_PLUGIN_PATH", &fixture().plugins));
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
    // The example verifies: every sync's st256 digest was checked by the vllm plugin.
    assert_every_sync_verified(&events);
}

/// Applies an update the way the contract allows: paused, then serving again.
pub(crate) fn apply_paused(e: &EngineBox, update: WeightUpdate) -> tandem_plugin_api::UpdateReport {
    ok(e.pause_generation(PauseMode::Wait));
    let report = ok(e.apply_weight_update(update));
    ok(e.continue_generation());
    report
}

/// SIGKILLs rank 0 of a torchrun trainer (its pid from `stats`).
/// Trains `rounds` steps on `train`, exporting `kind` after each: every export carries the
/// `st256` digest of the directory it names (`files::digest::digest_dir`), that directory's
/// state file holds the exported version, and the parent keeps exactly the two newest
/// versions (no stage left). Returns the last update.
pub(crate) fn exports_carry_digests_and_keep_two(
    t: &mut TrainerBox,
    kind: UpdateKind,
    train: &TrainBatch,
    rounds: usize,
) -> WeightUpdate {
    let mut exported = Vec::new();
    let mut last = None;
    for _ in 0..rounds {
        ok(t.train_step(train.clone()));
        let start = Instant::now();
        let update = ok(t.export_weight_update(kind));
        let export_s = start.elapsed().as_secs_f64();
        let dir = match &update.payload {
            UpdatePayload::CheckpointDir { dir } | UpdatePayload::Adapter { dir, .. } => {
                PathBuf::from(dir.as_str())
            }
            other => panic!("{} export gave {other:?}", kind.as_str()),
        };
        let start = Instant::now();
        let on_disk = digest_dir(&dir).unwrap();
        eprintln!(
            "{} v{}: export {export_s:.2} s, digest_dir {:.3} s, {}",
            kind.as_str(),
            update.version,
            start.elapsed().as_secs_f64(),
            update.digest
        );
        assert_eq!(update.digest.as_str(), on_disk, "{}", dir.display());
        assert_eq!(
            saved_version(&dir),
            Some(update.version),
            "{}",
            dir.display()
        );
        exported.push(update.version);
        let parent = dir.parent().unwrap();
        let mut held: Vec<String> = std::fs::read_dir(parent)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        held.sort_by_key(|n| n.trim_start_matches('v').parse::<u64>().unwrap_or(u64::MAX));
        // The first round may follow an export of the caller's; from the second on, the
        // parent holds exactly this round's version and the one before.
        let newest = format!("v{}", update.version);
        if let [.., before, _] = exported.as_slice() {
            assert_eq!(held, [format!("v{before}"), newest], "{}", parent.display());
        } else {
            assert!(held.len() <= 2 && held.last() == Some(&newest), "{held:?}");
        }
        last = Some(update);
    }
    last.unwrap()
}

pub(crate) fn kill_rank0(t: &TrainerBox) {
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
}

/// `tandem run` of a job whose trainer section is `trainer`, with no `options.python`, no
/// `$TANDEM_PYTHON` and no pointer file (an empty `TANDEM_VENV_ROOT`): one error line holding
/// every string of `wants`, no panic.
pub(crate) fn assert_no_venv_is_one_line(trainer: &str, wants: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let no_venv = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "[engine]\nplugin = \"native\"",
        trainer,
        "[bridge]\nmode = \"checkpoint\"\nverify = false",
    );
    let out = run(tandem()
        .arg("run")
        .arg(&job)
        .env_remove("TANDEM_PYTHON")
        .env("TANDEM_VENV_ROOT", no_venv.path())
        .env("TANDEM_PLUGIN_PATH", &fixture().plugins));
    assert!(!out.status.success());
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{}", stderr(&out));
    for want in wants {
        assert!(lines[0].contains(want), "`{want}` missing: {}", lines[0]);
    }
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

/// Every process whose command line or environment names `dir` (tandem workers by their spec
/// path, torchrun agents and ranks by `TANDEM_TORCHRUN_CONFIG`), with its command line.
pub(crate) fn processes_under(dir: &Path) -> Vec<(i32, String)> {
    let root = dir.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
        let (cmd, env) = (read("cmdline"), read("environ"));
        let text = |b: &[u8]| String::from_utf8_lossy(b).replace('\0', " ");
        if text(&cmd).contains(&root) || text(&env).contains(&root) {
            out.push((pid, text(&cmd)));
        }
    }
    out
}

/// The pid of torchrun rank `rank` of the job a trainer of the run in `run_dir` launched
/// (its environment holds `RANK=<rank>` and the run dir in `TANDEM_TORCHRUN_CONFIG`; the
/// torchrun agent has no `RANK`), from /proc.
pub(crate) fn torchrun_rank_pid(run_dir: &Path, rank: u32) -> Option<i32> {
    let root = run_dir.to_string_lossy().into_owned();
    let want = format!("RANK={rank}");
    processes_under(run_dir).into_iter().find_map(|(pid, _)| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let vars: Vec<String> = env
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        let ours = vars
            .iter()
            .any(|v| v.starts_with("TANDEM_TORCHRUN_CONFIG=") && v.contains(&root));
        (ours && vars.contains(&want)).then_some(pid)
    })
}

/// Waits up to `limit` for every process of `dir` ([`processes_under`]) to be gone; kills
/// what is left and panics naming it.
pub(crate) fn assert_no_leftovers(dir: &Path, limit: std::time::Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if processes_under(dir).is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let left = processes_under(dir);
    for (pid, _) in &left {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    assert!(
        left.is_empty(),
        "processes left behind after the run: {left:?}"
    );
}
