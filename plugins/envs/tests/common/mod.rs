//! What the Python pool tests share: the interpreter, the test modules (written into a
//! temporary job directory), samples and reward accessors.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test file uses a part

use std::path::{Path, PathBuf};
use tandem_plugin_api::{
    EnvItem, EnvironmentBox, EnvironmentConfig, Reward, RewardStatus, ScoreSample,
};
use tandem_plugin_envs::python::{PoolOptions, PythonReward};

/// Rewards whose behaviour the completion text picks (`rewards:controlled`), and one per
/// signature.
pub const REWARDS: &str = r#"
import asyncio, os, signal, time

def controlled(data_source, solution_str, ground_truth, extra_info=None):
    s = solution_str
    if s == "sleep":
        while True:
            time.sleep(3600)
    if s == "spin":
        while True:
            pass
    if s == "raise":
        raise ValueError("boom")
    if s == "exit":
        os._exit(3)
    if s == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if s == "print":
        print("a reward that prints", flush=True)
        os.write(1, b"{not json}\n")
        return 0.5
    if s == "hog":
        return len(bytearray(2 * 1024 ** 3))
    return {"nan": float("nan"), "inf": float("inf"), "big": 7.0, "none": None}.get(s, 1.0)

def verl_exact(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "source_is_math": data_source == "math"}

def trl_exact(prompts, completions, answer, **kwargs):
    if "short" in completions:
        return [1.0] * (len(completions) - 1)
    return [float(c == a) for c, a in zip(completions, answer)]

def trl_ids(prompts, completions, completion_ids, weight, **kwargs):
    return [len(ids) * 0.125 + w for ids, w in zip(completion_ids, weight)]

def trl_chat(prompts, completions, **kwargs):
    return [float(p[-1]["content"] == "hi" and c == [{"role": "assistant", "content": "yo"}])
            for p, c in zip(prompts, completions)]

async def async_verl(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0)
    if solution_str == "raise":
        raise ValueError("async boom")
    return float(solution_str == ground_truth)

def with_pid(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "pid": os.getpid()}

def not_a_reward(x, y):
    return 1.0
"#;

/// A tiny environment class: train item i asks for `seed + i % n` (id `train-i`, an epoch
/// of `n`), held-out item i for `seed + 1000 + i`; the reward is exactness, reported as the
/// component `exact`.
pub const TINY_ENV: &str = r#"
class Tiny:
    def __init__(self, seed, held_out, n=5):
        self.seed, self.held, self.n = seed, held_out, n

    def describe(self):
        return {"splits": {"train": self.n, "held_out": self.held}, "components": ["exact"],
                "sources": ["tiny"], "reward_range": [0, 1]}

    def item(self, split, index):
        if split not in ("train", "held_out"):
            raise ValueError(f"no split {split!r}")
        if split == "held_out" and index >= self.held:
            raise IndexError(f"held-out item {index} of {self.held}")
        base = 0 if split == "train" else 1000
        v = self.seed + base + index % self.n
        return {"id": f"{split}-{index}", "prompt": f"say {v}", "answer": str(v),
                "source": "tiny", "metadata": {"index": index}}

    def score(self, items, completions):
        return [{"value": float(c["text"] == i["answer"]),
                 "components": {"exact": float(c["text"] == i["answer"])}}
                for i, c in zip(items, completions)]
"#;

/// The interpreter the tests drive: the one the pool would find (`$TANDEM_PYTHON`, else the
/// venv `scripts/setup-python.sh` recorded), else `python3`.
pub fn python() -> PathBuf {
    tandem_plugin_support::resolve_python(None)
        .map_or_else(|_| PathBuf::from("python3"), |p| p.path)
}

/// Whether `python()` imports `modules` (a comma-separated list); prints why not.
pub fn imports(modules: &str) -> bool {
    let out = std::process::Command::new(python())
        .args(["-c", &format!("import {modules}")])
        .output();
    match out {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("");
            println!(
                "SKIPPED: {} cannot import {modules} ({last}); run `bash scripts/setup-python.sh`",
                python().display()
            );
            false
        }
        Err(e) => {
            println!("SKIPPED: cannot run {}: {e}", python().display());
            false
        }
    }
}

/// Writes `<dir>/<name>.py`; returns `dir`.
pub fn write_module(dir: &Path, name: &str, text: &str) -> PathBuf {
    std::fs::write(dir.join(format!("{name}.py")), text).unwrap();
    dir.to_path_buf()
}

/// Starts `function` from a module `rewards` holding `module`, in a fresh temporary job
/// and run directory (leaked: the pool's logs stay readable after a failure).
pub fn start(function: &str, options: &PoolOptions, module: &str) -> PythonReward {
    let dir = tempfile::tempdir().unwrap().keep();
    write_module(&dir, "rewards", module);
    let options = PoolOptions {
        python: Some(python()),
        ..options.clone()
    };
    PythonReward::new(
        function,
        &options,
        &dir,
        &dir.join("run").display().to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A completion `text` of a text item with answer `answer`, source `math`, metadata
/// `{"weight": 0.25}`; its token ids are its bytes.
pub fn sample(text: &str, answer: &str) -> ScoreSample {
    ScoreSample {
        item: EnvItem {
            source: "math".into(),
            metadata_json: r#"{"weight": 0.25}"#.into(),
            ..EnvItem::text("train-0", "question", answer)
        },
        completion: tandem_plugin_api::CompletionText {
            text: text.into(),
            token_ids: text.bytes().map(u32::from).collect(),
            finished: true,
        },
    }
}

/// The value of an `ok` reward (panics otherwise, showing it).
pub fn ok(r: &Reward) -> f32 {
    assert_eq!(r.status, RewardStatus::Ok, "{r:?}");
    r.value
}

/// The reasons of the failed rewards.
pub fn reasons(rs: &[Reward]) -> Vec<String> {
    rs.iter()
        .filter(|r| r.status == RewardStatus::Failed)
        .map(|r| r.reason.to_string())
        .collect()
}

/// The config of the `python` environment with `options` (JSON object text), seed 3 and
/// `held_out`, in `dir` (job directory; the run directory is `<dir>/run`).
pub fn env_config(options: &str, dir: &Path, held_out: u32) -> EnvironmentConfig {
    EnvironmentConfig {
        component: "python".into(),
        options_json: options.into(),
        seed: 3,
        held_out,
        base_dir: dir.display().to_string().into(),
        run_dir: dir.join("run").display().to_string().into(),
    }
}

/// Builds the `python` environment of `config` (panics with the error).
pub fn build_env(config: &EnvironmentConfig) -> EnvironmentBox {
    tandem_plugin_envs::python::env::build(config).unwrap_or_else(|e| panic!("{e}"))
}
