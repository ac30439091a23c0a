//! `tandem bench env`: how fast environments score, through the public path — the built-in
//! `dataset` environment built with [`Env::build`] on the built-in registry, one batched
//! [`Env::score`] per step as the loop calls it (the loop waits on that call inside the
//! step, so a batch's seconds are the seconds scoring adds to a step).
//!
//! - A bare Python reward (verl signature, returns 1.0), 1 worker: seconds per sample,
//!   beside the same function called inside Python (a loop in the same interpreter).
//! - A 3 ms Python reward (`time.sleep(0.003)`: wall time, not CPU, so the figure is the
//!   pool's and not the machine's core count) over 512 samples with 1, 2 and 4 workers:
//!   seconds per step and samples/s beside the ideal — samples × the reward's own time
//!   (measured inside Python in the same run) / workers. The 2-worker row carries issue
//!   #38's target: ≤ 1 s added to a step.
//! - The built-in Rust `math` verifier over the same samples: seconds per sample beside the
//!   bare Python call.
//!
//! The Python files are written to a scratch directory at run time; the interpreter is the
//! pool's (`$TANDEM_PYTHON`, else the recorded venv). `--quick`: 64 samples, fewer repetitions.

use super::Figure;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;
use tandem_cli::error::CliError;
use tandem_plugin_envs::python::PoolOptions;
use tandem_rl::config::EnvironmentSection;
use tandem_rl::env::{Env, EnvSpec, Problem, ToScore};
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;

/// The reward functions, written as `bench_rewards.py` in the scratch directory.
const REWARDS: &str = r#"
import time

def bare(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0

def sleep3(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.003)
    return 1.0 if ground_truth in solution_str else 0.0
"#;

/// Times the same functions inside Python: argv = the scratch directory, calls of `bare`
/// per round, calls of `sleep3`; prints `{"bare_s", "sleep_s"}` (seconds per call).
const DIRECT: &str = r#"
import json, sys, time
sys.path.insert(0, sys.argv[1])
import bench_rewards as r
n, k = int(sys.argv[2]), int(sys.argv[3])
args = ("bench", "so the answer is \\boxed{1/2}.", "\\frac{1}{2}", {})
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    for _ in range(n):
        r.bare(*args)
    best = min(best, (time.perf_counter() - t) / n)
t = time.perf_counter()
for _ in range(k):
    r.sleep3(*args)
print(json.dumps({"bare_s": best, "sleep_s": (time.perf_counter() - t) / k}))
"#;

/// Worker counts of the 3 ms reward.
const WORKERS: [usize; 3] = [1, 2, 4];
/// Issue #38: a 3 ms reward over 512 samples with 2 workers adds at most this to a step.
const STEP_TARGET_S: f64 = 1.0;
/// The batch size #38's target is stated for.
const TARGET_SAMPLES: usize = 512;

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Samples per batch.
    samples: usize,
    /// Timed batches per case (after one warm-up batch); the median is reported.
    reps: usize,
    /// Calls of the 3 ms reward timed inside Python.
    direct_sleeps: usize,
}

/// Runs the benchmark (`quick`: 64 samples, 2 timed batches per case).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let sizes = if quick {
        Sizes {
            samples: 64,
            reps: 2,
            direct_sleeps: 16,
        }
    } else {
        Sizes {
            samples: TARGET_SAMPLES,
            reps: 5,
            direct_sleeps: 100,
        }
    };
    super::rl_loop::in_scratch("env", |tmp| run_in(tmp, sizes))
}

fn run_in(tmp: &Path, s: Sizes) -> Result<Vec<Figure>, CliError> {
    let python = PoolOptions::default()
        .interpreter("Python rewards")
        .map_err(|e| CliError::plugin("tandem bench env", e))?;
    let write = |name: &str, text: &str| {
        let path = tmp.join(name);
        std::fs::write(&path, text).map_err(CliError::io(format!("writing {}", path.display())))
    };
    write("bench_rewards.py", REWARDS)?;
    write("data.jsonl", &rows(s.samples))?;
    let registry = Registry::builtins().map_err(RuntimeError::Plugins)?;
    let direct = direct_costs(&python, tmp, s)?;
    let n = s.samples;
    let nf = n as f64;
    let bench = Bench {
        registry: &registry,
        tmp,
        sizes: s,
    };

    let bare = bench.seconds("bare", python_reward("bench_rewards:bare", 1, &python))?;
    let mut figures = vec![
        Figure::new(
            "env",
            &format!("python bare reward (verl), {n} samples, 1 worker: per sample"),
            bare / nf * 1e6,
            "us",
            direct.bare_s * 1e6,
        )
        .limit_name("the same call inside Python"),
    ];
    for w in WORKERS {
        let reward = python_reward("bench_rewards:sleep3", w, &python);
        let secs = bench.seconds(&format!("sleep3-{w}"), reward)?;
        let ideal = nf * direct.sleep_s / w as f64;
        let case = format!("python 3 ms reward (time.sleep), {n} samples, {w} workers");
        let mut per_step = Figure::new("env", &format!("{case}: s per step"), secs, "s", ideal)
            .limit_name("ideal: samples x the reward's own time / workers");
        if w == 2 && n == TARGET_SAMPLES {
            per_step = per_step.target(&format!(
                "value <= {STEP_TARGET_S} s (#38), ratio <= {:.2}",
                STEP_TARGET_S / ideal
            ));
        }
        figures.push(per_step);
        figures.push(
            Figure::new(
                "env",
                &format!("{case}: samples/s"),
                nf / secs,
                "samples/s",
                nf / ideal,
            )
            .limit_name("ideal: workers / the reward's own time"),
        );
    }
    let math = bench.seconds("math", json!({"verifier": "math"}))?;
    figures.push(
        Figure::new(
            "env",
            &format!("rust math verifier, {n} samples: per sample"),
            math / nf * 1e6,
            "us",
            bare / nf * 1e6,
        )
        .limit_name("bare Python reward call, per sample"),
    );
    Ok(figures)
}

/// A Python reward spec of the `dataset` environment.
fn python_reward(function: &str, workers: usize, python: &Path) -> Value {
    json!({"python": function, "workers": workers, "interpreter": python.display().to_string()})
}

/// Row `i` of the data: `a/b` as a fraction.
fn fraction(i: usize) -> (usize, usize) {
    (i % 97 + 1, i % 13 + 2)
}

/// The JSONL of `n` rows: a prompt and a LaTeX fraction answer each.
fn rows(n: usize) -> String {
    (0..n)
        .map(|i| {
            let (a, b) = fraction(i);
            let row = json!({"prompt": format!("What is {a} divided by {b}?"),
                             "answer": format!("\\frac{{{a}}}{{{b}}}")});
            format!("{row}\n")
        })
        .collect()
}

/// A completion for row `i`: the right value for even rows (written `a/b`), a wrong one for
/// odd rows, so the verifier compares both ways.
fn completion(i: usize) -> String {
    let (a, b) = fraction(i);
    let a = if i.is_multiple_of(2) { a } else { a + 1 };
    format!("Dividing {a} by {b} leaves it as a fraction, so the answer is \\boxed{{{a}/{b}}}.")
}

/// Seconds per call of the functions inside Python (same interpreter, same run).
struct Direct {
    bare_s: f64,
    sleep_s: f64,
}

fn direct_costs(python: &Path, tmp: &Path, s: Sizes) -> Result<Direct, CliError> {
    let out = std::process::Command::new(python)
        .args(["-c", DIRECT])
        .arg(tmp)
        .args([(s.samples * 100).to_string(), s.direct_sleeps.to_string()])
        .output()
        .map_err(CliError::io(format!("running {}", python.display())))?;
    let fail = |why: String| CliError::failed(format!("tandem bench env: timing in Python: {why}"));
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(fail(err.lines().last().unwrap_or("no output").to_owned()));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| fail(e.to_string()))?;
    let get = |k: &str| {
        v[k].as_f64()
            .filter(|x| *x > 0.0)
            .ok_or_else(|| fail(format!("no {k} in {v}")))
    };
    Ok(Direct {
        bare_s: get("bare_s")?,
        sleep_s: get("sleep_s")?,
    })
}

/// Builds environments in the scratch directory and times their batches.
struct Bench<'a> {
    registry: &'a Registry,
    tmp: &'a Path,
    sizes: Sizes,
}

impl Bench<'_> {
    /// Median seconds of one batched score of the `dataset` environment with `reward`, after
    /// a warm-up batch (the pool started, every worker's import done). A failed sample is an
    /// error: the figure would not be a reward's cost.
    fn seconds(&self, label: &str, reward: Value) -> Result<f64, CliError> {
        let mut options = serde_json::Map::new();
        options.insert("path".into(), "data.jsonl".into());
        options.insert("shuffle".into(), false.into());
        options.insert("reward".into(), reward);
        let section = EnvironmentSection {
            plugin: "dataset".into(),
            options,
            ..EnvironmentSection::default()
        };
        let run_dir = self.tmp.join(format!("run-{label}"));
        std::fs::create_dir_all(&run_dir)
            .map_err(CliError::io(format!("creating {}", run_dir.display())))?;
        let spec = EnvSpec {
            section: &section,
            seed: 0,
            held_out: 0,
            base_dir: self.tmp,
        };
        let env = Env::build(self.registry, spec, Some(&run_dir))?;
        let problems: Vec<Problem> = (0..self.sizes.samples as u64)
            .map(|i| env.problem(i))
            .collect::<Result<_, _>>()?;
        let batch: Vec<ToScore<'_>> = problems
            .iter()
            .map(|p| ToScore {
                problem: p,
                text: completion(p.index as usize),
                token_ids: vec![1; 24],
                finished: true,
            })
            .collect();
        let mut times = Vec::with_capacity(self.sizes.reps);
        for rep in 0..=self.sizes.reps {
            let started = Instant::now();
            let scored = env.score(&batch);
            let secs = started.elapsed().as_secs_f64();
            if scored.tally.failed > 0 {
                let why = scored.tally.reasons.keys().next().cloned();
                return Err(CliError::failed(format!(
                    "tandem bench env: {label}: {} of {} samples failed: {}",
                    scored.tally.failed,
                    scored.tally.samples,
                    why.unwrap_or_default()
                )));
            }
            if rep > 0 {
                times.push(secs);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }
}
