//! The RL-shaped step of `tandem bench native`: the native trainer and torch on the batch of
//! one GRPO step of the SmolLM2 example's shape — [`RL_B`] sequences (8 prompts × 8
//! completions) of 56–64 prompt tokens and [`RL_COMPLETION`] completion tokens — full
//! fine-tuning and LoRA, time per step and the peak memory rise of the step, each beside
//! torch doing the same step in the same run (completion-only loss: hidden states of every
//! position, the LM head over the completion positions only; micro-batches of
//! [`TORCH_MICRO`] sequences, gradients accumulated, the token mean over the whole batch).
//!
//! The native trainer runs with `micro_batch_sequences` = [`NATIVE_MICRO`] (its head is
//! chunked and runs over the loss positions only, see `plugins/native/core/src/head.rs`).
//! Peak memory rise: the process's peak resident set (`VmHWM`, reset through
//! `/proc/self/clear_refs` just before the trainer is created — before torch loads the
//! model on its side) minus the resident set at that moment: what loading the model, the
//! optimizer state and the steps add. One warm-up step (it allocates the optimizer moments
//! on the torch side), then the median of the timed steps. The GEMM bound of the step is
//! printed beside: 6 (full) or 4 (LoRA) FLOPs per body parameter and token, the LM head's
//! (6 · V · d) per completion token, and attention's 12 · layers · T · d per token, at the
//! machine's GEMM rate.

use std::time::Instant;

use serde_json::json;
use tandem_cli::error::CliError;
use tandem_plugin_api::{TrainBatch, WhichWeights};
use tandem_rl::algorithm::grpo::{self, Sample};
use tandem_runtime::role::{Local, Trainer};
use tandem_runtime::services::Services;

use super::{BENCH, Ctx, Figure, LORA_ALPHA, LORA_RANK, config, median, metric, native_ref};

/// Sequences of the step (8 groups of 8).
pub(super) const RL_B: usize = 64;
const RL_GROUP: usize = 8;
/// Completion tokens per sequence.
pub(super) const RL_COMPLETION: usize = 48;
/// torch's micro-batch, sequences.
pub(super) const TORCH_MICRO: usize = 16;
/// The native trainer's micro-batch, sequences.
pub(super) const NATIVE_MICRO: usize = 4;
const LR: f32 = 1e-5;
const CLIP: f32 = 0.2;

/// Prompt length of sequence `i`: 56..=64 (the example's chat prompts are ~60 tokens).
fn prompt_len(i: usize) -> usize {
    56 + (i / RL_GROUP * 5) % 9
}

/// The step's samples over a vocabulary of `vocab`.
fn samples(vocab: usize) -> Vec<Sample> {
    (0..RL_B)
        .map(|i| {
            let p = prompt_len(i);
            let row: Vec<u32> = (0..p + RL_COMPLETION)
                .map(|j| {
                    // Prompts shared within a group, completions per sequence.
                    let key = if j < p {
                        (i / RL_GROUP) * 1000 + j
                    } else {
                        i * 1000 + j
                    };
                    ((key * 7919 + 17) % vocab) as u32
                })
                .collect();
            Sample {
                group: i / RL_GROUP,
                prompt: row[..p].to_vec(),
                completion: row[p..].to_vec(),
                logprobs: Vec::new(),
                reward: ((i * 3 + i / RL_GROUP) % 2) as f32,
                version: 0,
                turn: None,
            }
        })
        .collect()
}

/// Resets the peak resident set (`VmHWM`) and returns the current one (`VmRSS`), bytes.
fn reset_peak() -> f64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kb("VmRSS:") * 1024.0
}

/// A `/proc/self/status` field in kB (NaN if unreadable).
fn status_kb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(f64::NAN)
}

impl Ctx<'_> {
    /// The RL-shaped step (full or LoRA): its time and memory figures beside torch's (or the
    /// GEMM bound alone without torch).
    pub(super) fn rl_step(&self, lora: bool) -> Result<Vec<Figure>, CliError> {
        let kind = if lora { "lora" } else { "full" };
        let mut options = json!({"digest": false, "micro_batch_sequences": NATIVE_MICRO});
        let longest = (0..RL_B).map(prompt_len).max().unwrap_or(0) + RL_COMPLETION;
        options["micro_batch_tokens"] = json!(NATIVE_MICRO * longest);
        if lora {
            options["lora"] = json!({"rank": LORA_RANK, "alpha": LORA_ALPHA, "seed": 1});
        }
        let base = reset_peak();
        let services = Services::new();
        let mut trainer = Local(
            self.registry
                .new_trainer(config(self.model, options), services.handle())?,
        );
        let info = trainer.init()?;
        let mut samples = samples(self.dims.vocab);
        let adv = grpo::advantages(&samples);
        let loss = grpo::loss(LR, CLIP, 0.0, 1.0);
        let probe = grpo::batch(&samples, &adv, loss.clone(), true);
        let old = trainer.compute_logprobs(probe, WhichWeights::Current)?;
        for (s, lp) in samples.iter_mut().zip(old) {
            s.logprobs = lp;
        }
        let batch = grpo::batch(&samples, &adv, loss, true);
        let tokens: usize = batch.sequences.iter().map(|s| s.tokens.len()).sum();
        eprintln!(
            "native: rl step b{RL_B} {kind} ({tokens} tokens, {} trainable parameters, \
             micro-batches of {NATIVE_MICRO}): warm-up + {} timed",
            info.trainable_params, self.plan.steps
        );
        let first = trainer.train_step(batch.clone())?;
        let mut seconds = Vec::new();
        for i in 0..self.plan.steps {
            let t = Instant::now();
            trainer.train_step(batch.clone())?;
            seconds.push(t.elapsed().as_secs_f64());
            eprintln!("native: rl step {kind} {}: {:.2} s", i + 1, seconds[i]);
        }
        let peak = status_kb("VmHWM:") * 1024.0;
        drop(trainer);
        let native_s = median(seconds);
        let rise = peak - base;
        let bound = self.rl_bound(lora, info.total_params as f64, tokens);
        eprintln!(
            "native: rl step {kind}: {native_s:.3} s, peak memory rise {:.0} MB (peak RSS {:.0} \
             MB); GEMM bound {bound:.3} s",
            rise / 1e6,
            peak / 1e6
        );
        let case = format!("{} rl step b{RL_B} {kind}", self.plan.name);
        let peer = if self.plan.peers {
            native_ref::torch_rl_step(
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
        let mut out = vec![
            Figure::new(BENCH, &format!("{case} time"), native_s, "s", bound)
                .limit_name("GEMM bound"),
        ];
        if let Some(t) = self.note(&format!("torch rl step ({kind})"), peer) {
            eprintln!(
                "native vs torch, first rl {kind} step: loss {:.6} vs {:.6}, grad norm {:.6} vs \
                 {:.6}; torch peak memory rise {:.0} MB (peak RSS {:.0} MB)",
                metric(&first, "loss"),
                t.step.first_loss,
                metric(&first, "grad_norm"),
                t.step.first_grad_norm,
                t.peak_rise_bytes / 1e6,
                t.peak_bytes / 1e6
            );
            let name = format!(
                "torch {} step, micro-batches of {TORCH_MICRO}",
                t.step.version
            );
            out.push(
                Figure::new(
                    BENCH,
                    &format!("{case} time"),
                    native_s,
                    "s",
                    t.step.median_s,
                )
                .limit_name(&name)
                .target(if lora { "<= 0.8" } else { "<= 0.7" }),
            );
            out.push(
                Figure::new(
                    BENCH,
                    &format!("{case} peak rise"),
                    rise / 1e6,
                    "MB",
                    t.peak_rise_bytes / 1e6,
                )
                .limit_name(&name)
                .target(if lora { "" } else { "<= 0.5" }),
            );
        }
        Ok(out)
    }

    /// The GEMM bound of one RL step over `tokens` tokens (see the module doc).
    fn rl_bound(&self, lora: bool, params: f64, tokens: usize) -> f64 {
        let d = self.dims;
        let head = (d.vocab * d.hidden) as f64;
        let body = (params - head).max(0.0);
        let per_token = if lora { 4.0 } else { 6.0 } * body;
        let t = tokens as f64 / RL_B as f64;
        let attention = 12.0 * d.layers as f64 * t * d.hidden as f64;
        let flops = (per_token + attention) * tokens as f64
            + if lora { 4.0 } else { 6.0 } * head * (RL_B * RL_COMPLETION) as f64;
        flops / self.machine.gemm_flops
    }
}

/// The batch as the torch script reads it: token rows, per-row prompt lengths, advantages,
/// the behaviour logprobs and the micro-batch.
fn batch_json(batch: &TrainBatch) -> serde_json::Value {
    let seqs = &batch.sequences;
    json!({
        "tokens": seqs.iter().map(|s| s.tokens.to_vec()).collect::<Vec<_>>(),
        "prompt_lens": seqs.iter().map(|s| s.prompt_len).collect::<Vec<_>>(),
        "advantages": seqs.iter().map(|s| s.advantage).collect::<Vec<_>>(),
        "lr": batch.loss.learning_rate,
        "clip_eps": batch.loss.clip_eps_low,
        "grad_clip": batch.loss.grad_clip,
        "micro_batch": TORCH_MICRO,
        "completion_only": true,
    })
}
