//! Shared helpers of the binary's test targets (`it`, `cluster`, `real`, each including this
//! module by path): the `tandem` binary, the fixture plugin libraries built by `cargo build
//! --workspace`, and scratch plugin directories; `rl` for RL jobs, `serve` for `tandem serve`.

#![allow(dead_code, clippy::unwrap_used)]

pub mod rl;
pub mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tandem_plugin_api::{
    ComponentConfig, LossConfig, LossKind, Metric, RVec, TrainBatch, TrainSequence,
};
use tandem_runtime::registry::Registry;

/// The `tandem` binary under test.
pub fn tandem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
}

/// `target/<profile>`: where cargo put the binary and the workspace's cdylibs.
pub fn target_profile_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_tandem"))
        .parent()
        .expect("binary has a parent dir")
        .to_path_buf()
}

/// Root of the workspace.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// Path of a workspace cdylib, e.g. `cdylib("fixture_alpha")`.
pub fn cdylib(crate_name: &str) -> PathBuf {
    let p = target_profile_dir().join(format!("lib{crate_name}.so"));
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (`cargo build --workspace`), as the README's test command does",
        p.display()
    );
    p
}

/// A fresh temporary directory holding copies of the given libraries (under the given names).
pub fn plugin_dir(files: &[(&Path, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_plugins(dir.path(), files);
    dir
}

/// Copies the given libraries into `dir` (under the given names).
pub fn copy_plugins(dir: &Path, files: &[(&Path, &str)]) {
    std::fs::create_dir_all(dir).expect("plugin dir");
    for (src, name) in files {
        std::fs::copy(src, dir.join(name)).expect("copy plugin");
    }
}

/// Runs a command and returns its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn tandem")
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every `sync` line of an `events.jsonl` text carries an `st256` digest the engines
/// verified, and there is at least one.
pub fn assert_every_sync_verified(events: &str) {
    let syncs: Vec<&str> = events
        .lines()
        .filter(|l| l.contains(r#""op":"sync""#))
        .collect();
    assert!(
        !syncs.is_empty()
            && syncs
                .iter()
                .all(|l| l.contains("digest st256:") && l.contains("verified true")),
        "{syncs:?}\n{events}"
    );
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Lines of stderr starting with `error:`.
pub fn error_lines(o: &Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .map(str::to_owned)
        .collect()
}

/// `$TANDEM_PYTHON` for the real-engine tests (`test` names the test binary); panics with how
/// to set it when it is unset, so an `--ignored` run never passes silently.
pub fn python_env(test: &str) -> String {
    std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| {
        panic!(
            "TANDEM_PYTHON is unset: run `export TANDEM_PYTHON=$(bash scripts/setup-python.sh | \
             tail -1)` before `cargo test -p tandem --test {test} -- --ignored`"
        )
    })
}

/// The value of a plugin call, or a panic naming the error.
pub fn ok<T>(r: tandem_plugin_api::RResult<T, tandem_plugin_api::PluginError>) -> T {
    match r {
        tandem_plugin_api::RResult::ROk(v) => v,
        tandem_plugin_api::RResult::RErr(e) => panic!("plugin call failed: {e}"),
    }
}

/// The error of a plugin call that must fail.
pub fn err<T>(
    r: tandem_plugin_api::RResult<T, tandem_plugin_api::PluginError>,
) -> tandem_plugin_api::PluginError {
    match r {
        tandem_plugin_api::RResult::ROk(_) => panic!("expected an error"),
        tandem_plugin_api::RResult::RErr(e) => e,
    }
}

/// `cargo` (the one running the tests) for building a separate workspace (the out-of-tree
/// examples, the ABI-skewed fixtures), without the workspace wrapper CI lints the test build
/// with (`RUSTC_WORKSPACE_WRAPPER` = clippy-driver): those crates are built, not linted.
pub fn cargo() -> std::process::Command {
    let mut c =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS");
    c
}

/// Builds the out-of-tree example crate at `manifest` (relative to the workspace root) into
/// the scratch target dir the out-of-tree tests share, and returns its library `lib`.
pub fn build_example(manifest: &str, lib: &str) -> PathBuf {
    let root = workspace_root();
    let target = root.join("target/out-of-tree");
    let out = cargo()
        .args(["build", "--offline", "-q", "--manifest-path"])
        .arg(root.join(manifest))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building {manifest} failed:\n{}",
        stderr(&out)
    );
    target.join("debug").join(lib)
}

/// A scratch directory for files a test binary shares between its tests for the whole
/// process (e.g. models written once): `<CARGO_TARGET_TMPDIR>/<name>-<pid>`. A static
/// `TempDir` is never dropped, so its directory outlived every run (≈ 110 MB each for the
/// bridge tests' models); here the first call removes the `<name>-<pid>` directories of
/// processes that are gone, so at most the live runs' directories remain.
pub fn process_scratch(name: &str) -> PathBuf {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("{name}-");
    if let Ok(entries) = std::fs::read_dir(base) {
        for e in entries.flatten() {
            let file_name = e.file_name();
            let pid = file_name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = base.join(format!("{prefix}{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a model with `tandem model init --preset <preset> --seed <seed> --out <out>`.
pub fn init_model(preset: &str, seed: u64, out: &Path) {
    let o = run(tandem()
        .args(["model", "init", "--preset", preset, "--seed"])
        .arg(seed.to_string())
        .arg("--out")
        .arg(out));
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The plugins found in `dir`.
pub fn discover(dir: &Path) -> Registry {
    Registry::discover(&[dir.to_path_buf()]).unwrap()
}

/// A training sequence with no advantage and no old or reference log-probs.
pub fn seq(tokens: &[u32], prompt_len: u32) -> TrainSequence {
    TrainSequence {
        tokens: tokens.to_vec().into(),
        prompt_len,
        advantage: 0.0,
        old_logprobs: RVec::new(),
        ref_logprobs: RVec::new(),
    }
}

/// The tests' loss: `kind` at learning rate `lr`, clip 0.2 both sides, no KL, grad clip 1.
pub fn loss(kind: LossKind, lr: f32) -> LossConfig {
    LossConfig {
        kind,
        clip_eps_low: 0.2,
        clip_eps_high: 0.2,
        kl_coef: 0.0,
        learning_rate: lr,
        grad_clip: 1.0,
    }
}

/// A batch of `seqs` under [`loss`]`(kind, lr)`.
pub fn batch_of(seqs: Vec<TrainSequence>, kind: LossKind, lr: f32) -> TrainBatch {
    TrainBatch {
        sequences: seqs.into(),
        loss: loss(kind, lr),
    }
}

/// A tiny model (`tandem model init`, `<dir>/m`) in a scratch directory, and a plugin directory.
pub struct ModelFixture {
    /// The scratch directory (the model, and whatever the tests write next to it): a
    /// [`process_scratch`] directory, as the fixture lives for the whole test process.
    pub dir: PathBuf,
    /// The model directory.
    pub model: PathBuf,
    /// The plugin directory (inside `dir`).
    pub plugins: PathBuf,
}

/// The tiny preset at `seed`, with the plugin libraries `libs` (as in [`plugin_dir`]).
pub fn model_fixture(seed: u64, libs: &[(&Path, &str)]) -> ModelFixture {
    let dir = process_scratch("model-fixture");
    let model = dir.join("m");
    init_model("tiny", seed, &model);
    let plugins = dir.join("plugins");
    copy_plugins(&plugins, libs);
    ModelFixture {
        dir,
        model,
        plugins,
    }
}

/// A single-rank CPU configuration of `component` on `model`, running in `run_dir`.
pub fn cpu_config(component: &str, model: &Path, options: &str, run_dir: &Path) -> ComponentConfig {
    ComponentConfig {
        component: component.into(),
        model_path: model.display().to_string().into(),
        options_json: options.into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: run_dir.display().to_string().into(),
    }
}

/// The value of the metric `name`; panics naming it when it is missing.
pub fn metric_value(metrics: &[Metric], name: &str) -> f64 {
    metrics
        .iter()
        .find(|m| m.name.as_str() == name)
        .unwrap_or_else(|| panic!("no metric {name} in {metrics:?}"))
        .value
}

/// The largest absolute difference of two equally long slices.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `steps` in order, printing each step's name and time to stderr: an ordered suite
/// (one server, trainer group or cluster carried from step to step) is one test.
pub fn in_order(steps: &[(&str, fn())]) {
    for (name, step) in steps {
        let start = std::time::Instant::now();
        eprintln!("step {name} ...");
        step();
        eprintln!("step {name}: done in {:.1?}", start.elapsed());
    }
}

/// Serialises the `it` tests that allocate shared memory in this process or measure it
/// (`RssShmem` is process-wide, and every test of a target shares its process).
pub fn process_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
