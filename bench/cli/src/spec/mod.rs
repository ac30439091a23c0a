//! `tandem bench spec`: speculative decoding with an EAGLE-3 drafter trained in the same run,
//! and the hidden-state transfer that feeds its training.
//!
//! For each model — the `tiny` preset warm-started on the quickstart's arithmetic task (60
//! supervised steps, `max_operand` 3: a quickstart-like model), the `small` preset (random
//! init) and SmolLM2-135M-Instruct when its GGUF file is in Tandem's cache (skipped with one
//! line otherwise; nothing is downloaded). The two presets' greedy continuations are mostly
//! runs of one repeated token (the tiny model's answer, then end-of-sequence and repeats), so
//! their drafters reach acceptance lengths near `draft_tokens + 1`: their rows measure what
//! speculation costs at near-ideal acceptance; SmolLM2's are a real model's. Per model:
//!
//! 1. **A drafter is trained** in this process (`train.rs`): the `native-drafter` trainer
//!    (`ttt_steps` 4) on the target's own greedy continuations of arithmetic prompts with
//!    operands up to 999 (`+` and `-`: a variety of digit strings), the features from the
//!    engine's `hidden_states` (`Inline` route) into `train_step_features`, a fixed number of
//!    steps over a fixed pool of sequences; then `save_checkpoint` into a scratch directory.
//! 2. **Decode with and without it** (`decode.rs`) on held-out prompts (another seed of the
//!    task): two engines of the same configuration, one with the `drafter` option, greedy,
//!    exactly N new tokens per sequence (no stop ids), batch 1, 4 and 16; one warm-up call
//!    each, then 3 calls per batch alternating between the engines, the median. Three
//!    figures per batch: the plain tok/s beside the machine's memcpy/GEMM bound (as in
//!    `bench native`); the speculative tok/s beside the plain tok/s (ratio = speedup); the
//!    speedup beside the mean acceptance length of those calls (tokens per verification —
//!    the speedup if a round cost one plain decode step and drafting were free). The greedy
//!    tokens must be the same with and without the drafter: a warning line says when not.
//!    The round's cost goes to stderr: per verify round of the batch, the time drafting and
//!    verifying (the engine's `spec.draft_s` / `spec.verify_s` / `spec.verifies`) and the
//!    rest, in milliseconds and in plain decode steps.
//! 3. **Hidden-state transfer** (`transfer.rs`, the `small` model; `tiny` with `--quick`): a
//!    `native` engine and a `native-drafter` trainer in two `tandem worker` processes joined
//!    in one transport world with a `pair0` group (as `tandem run` starts a drafter job);
//!    the engine's `hidden_states` on the `Transport` route concurrent with the trainer's
//!    `train_step_features`; bandwidth = bytes sent ÷ the engine's send time (its stats),
//!    beside a memcpy of the same size in this process (timed as `bench transport` times
//!    it), for 1, 4 and 16 MiB messages; one warm-up message per size, then the median of 3.
//!    One message per call: the receiver has been waiting through the engine's forward, so
//!    its wake-up is part of the figure (`bench transport` streams back-to-back messages).
//!
//! Steps and sizes per model are `Plan::of`'s. tiny + small take about 3 minutes on the
//! 2-core VM, SmolLM2 (a drafter over its 49 152-token vocabulary) 5–8 more. `--quick`
//! (the tests): the `tiny` preset only (10 warm-start steps), 30 drafter steps, 16 new
//! tokens, one timed call per batch, one 1 MiB transfer. Timings are not asserted.

mod decode;
mod train;
mod transfer;

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::Figure;
use tandem_bench_report::machine::{self, Machine};
use tandem_cli::error::CliError;
use tandem_plugin_envs::tasks::{self, Task, TaskSpec};
use tandem_rl::config::EnvironmentSection;
use tandem_rl::env::{Env, EnvSpec};
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;

const BENCH: &str = "spec";
/// Decode batch sizes.
const BATCHES: [usize; 3] = [1, 4, 16];
/// Draft tokens per speculative round (the engine's `draft_tokens`).
const DRAFT_TOKENS: usize = 4;
/// Seed of the drafter's training prompts; the held-out prompts use another stream.
const TRAIN_SEED: u64 = 11;
const HELD_OUT_SEED: u64 = 0x05ee_d0ff;

/// What one model's run measures.
#[derive(Debug, Clone)]
struct Plan {
    /// Name in the figures.
    name: &'static str,
    /// Drafter training: optimiser steps, sequences per step, sequences in the pool, new
    /// tokens per training sequence.
    steps: usize,
    batch: usize,
    pool: usize,
    train_tokens: usize,
    /// Decode: new tokens per sequence and timed calls per batch.
    new_tokens: usize,
    reps: usize,
}

impl Plan {
    fn of(name: &'static str, quick: bool) -> Plan {
        match (name, quick) {
            (_, true) => Plan {
                name,
                steps: 30,
                batch: 8,
                pool: 32,
                train_tokens: 24,
                new_tokens: 16,
                reps: 1,
            },
            ("smollm2", _) => Plan {
                name,
                steps: 60,
                batch: 8,
                pool: 64,
                train_tokens: 40,
                new_tokens: 32,
                reps: 3,
            },
            _ => Plan {
                name,
                steps: if name == "tiny" { 60 } else { 100 },
                batch: 8,
                pool: 128,
                train_tokens: 48,
                new_tokens: 64,
                reps: 3,
            },
        }
    }
}

/// Runs the benchmark (the `tiny` preset only with `quick`).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let scratch = std::env::temp_dir().join(format!("tandem-bench-spec-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(CliError::io(format!(
        "tandem bench spec: creating {}",
        scratch.display()
    )))?;
    let out = run_in(&scratch, quick);
    let _ = std::fs::remove_dir_all(&scratch);
    out
}

/// What every part needs.
struct Ctx<'a> {
    registry: &'a Registry,
    scratch: &'a Path,
    machine: Machine,
}

fn run_in(scratch: &Path, quick: bool) -> Result<Vec<Figure>, CliError> {
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    let m = machine::measure();
    eprintln!(
        "spec: machine: memcpy {:.1} GB/s, GEMM {:.1} GFLOP/s, {} threads",
        m.memcpy_bytes_per_s / 1e9,
        m.gemm_flops / 1e9,
        m.threads
    );
    let ctx = Ctx {
        registry: &registry,
        scratch,
        machine: m,
    };
    let mut names = vec!["tiny"];
    if quick {
        eprintln!(
            "tandem bench spec: --quick measures the tiny preset only (few steps, short decode)"
        );
    } else {
        names.push("small");
        names.push("smollm2");
    }
    // The hidden-state transfer is measured on one model.
    let transfer_model = if quick { "tiny" } else { "small" };
    let mut figures = Vec::new();
    for name in names {
        let Some(model) = ctx.model(name, quick)? else {
            continue;
        };
        let plan = Plan::of(name, quick);
        let t = Instant::now();
        let drafter = train::train(&ctx, &model, &plan)?;
        eprintln!(
            "spec: {name}: drafter trained in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        figures.push(drafter.figure(name));
        figures.extend(decode::measure(&ctx, &model, &drafter.dir, &plan)?);
        if name == transfer_model {
            let sizes: &[usize] = if quick {
                &[1 << 20]
            } else {
                &[1 << 20, 4 << 20, 16 << 20]
            };
            let reps = if quick { 1 } else { 3 };
            figures.extend(transfer::measure(&ctx, &model, name, sizes, reps)?);
        }
    }
    Ok(figures)
}

impl Ctx<'_> {
    /// The model directory of `name`, or `None` (with one line) when SmolLM2 is not cached.
    fn model(&self, name: &str, quick: bool) -> Result<Option<PathBuf>, CliError> {
        let dir = self.scratch.join(name);
        match name {
            "tiny" => {
                let init = self.scratch.join("tiny-init");
                tandem_rl::warmstart::create_preset(self.registry, &init, "tiny", 7)?;
                let env = env(self.registry, 3, &["+"], 0)?;
                let opts = tandem_rl::warmstart::SftOptions {
                    steps: if quick { 10 } else { 60 },
                    ..tandem_rl::warmstart::SftOptions::default()
                };
                let r = tandem_rl::warmstart::sft(self.registry, &init, &dir, &env, &opts)?;
                eprintln!(
                    "spec: tiny: warm start on arithmetic (max_operand 3), {} steps: loss {:.3} \
                     -> {:.3}, greedy accuracy {:.0}%",
                    opts.steps,
                    r.first_loss,
                    r.last_loss,
                    r.accuracy * 100.0
                );
            }
            "small" => {
                tandem_rl::warmstart::create_preset(self.registry, &dir, "small", 7)?;
            }
            _ => {
                let known = tandem_model::fetch::known("smollm2")?;
                let Some(file) = tandem_model::fetch::cached(known) else {
                    eprintln!(
                        "tandem bench spec: SmolLM2 skipped: {} is not cached (tandem model \
                         fetch smollm2 puts it there)",
                        tandem_model::fetch::cache_path(known).display()
                    );
                    return Ok(None);
                };
                tandem_model::gguf::import(&file, &dir)?;
            }
        }
        Ok(Some(dir))
    }
}

fn arithmetic(max_operand: u32, ops: &[&str]) -> serde_json::Map<String, serde_json::Value> {
    let mut options = serde_json::Map::new();
    options.insert("max_operand".into(), max_operand.into());
    options.insert("ops".into(), ops.to_vec().into());
    options
}

/// The arithmetic environment with operands up to `max_operand`.
fn env(
    registry: &tandem_runtime::registry::Registry,
    max_operand: u32,
    ops: &[&str],
    seed: u64,
) -> Result<Env, CliError> {
    let section = EnvironmentSection {
        options: arithmetic(max_operand, ops),
        ..EnvironmentSection::default()
    };
    let spec = EnvSpec {
        section: &section,
        seed,
        held_out: 0,
        base_dir: Path::new("."),
    };
    Ok(Env::build(registry, spec, Some(&std::env::temp_dir()))?)
}

/// The arithmetic task with operands up to `max_operand`.
fn task(max_operand: u32, ops: &[&str], seed: u64) -> Result<Box<dyn Task>, CliError> {
    let spec = TaskSpec {
        kind: "arithmetic".into(),
        options: arithmetic(max_operand, ops),
    };
    tasks::build(&spec, seed).map_err(|e| CliError::failed(format!("tandem bench spec: {e}")))
}

/// `n` prompts of the drafter's arithmetic task (operands up to 999) from `seed`'s stream,
/// encoded for `model` (BOS + text).
fn prompts(model: &Path, seed: u64, n: usize) -> Result<Vec<Vec<u32>>, CliError> {
    let task = task(999, &["+", "-"], seed)?;
    let codec = tandem_rl::prompt::PromptCodec::load(model)?;
    (0..n as u64)
        .map(|i| Ok(codec.prompt(&task.problem(i).prompt)?))
        .collect()
}
