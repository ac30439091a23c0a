//! Benchmarks as library functions: decode tokens/s and train-step time for a model config
//! (random weights) or a loaded model, each reported beside the machine limit measured in the
//! same run (memcpy bandwidth for memory-bound decode, large-GEMM FLOP rate for compute-bound
//! training). `tandem bench native` runs them on the init presets, beside candle on the same
//! files; [`prompts`], [`train_tokens`] and [`logits`] give it the same inputs and outputs.

use std::time::Instant;

use crate::acts::ActLayout;
use crate::buffer::VecProvider;
use crate::config::ModelConfig;
use crate::engine::{Engine, EngineConfig, GenRequest};
use crate::error::Result;
use crate::loss::Loss;
use crate::model::Model;
use crate::optim::AdamW;
use crate::sampling::SamplingParams;
use crate::trainer::{Batch, Trainer};

/// Machine limits measured in this run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Single-thread `copy_from_slice` bandwidth, bytes copied per second.
    pub memcpy_bytes_per_s: f64,
    /// f32 GEMM rate at 512×512×512 through [`crate::linalg`], FLOP/s.
    pub gemm_flops: f64,
}

/// Measures [`Limits`].
pub fn limits() -> Limits {
    let n = 64 << 20; // 256 MiB of f32
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    let m = 512;
    let a = vec![0.5f32; m * m];
    let mut c = vec![0.0f32; m * m];
    let mut g = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        crate::linalg::linear(&mut c, &a, &a, m, m, m, false);
        g = g.min(t.elapsed().as_secs_f64());
    }
    Limits {
        memcpy_bytes_per_s: (n * 4) as f64 / best,
        gemm_flops: 2.0 * (m * m * m) as f64 / g,
    }
}

/// Decode throughput at one batch size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeFigure {
    /// Sequences decoded together.
    pub batch: usize,
    /// Generated tokens per second over the decode phase (prefill excluded).
    pub tokens_per_s: f64,
    /// Bound from bandwidth: each step reads every weight once →
    /// `batch · memcpy_bw / weight_bytes` tokens/s.
    pub bandwidth_bound_tokens_per_s: f64,
    /// Bound from compute: `gemm_flops / (2 · params)` tokens/s (what large batches hit).
    pub compute_bound_tokens_per_s: f64,
}

/// Prompt length used by the decode benchmarks.
pub const PROMPT_LEN: usize = 16;

/// The benchmark prompts: `b` rows of [`PROMPT_LEN`] tokens, `[b, PROMPT_LEN]` row-major.
pub fn prompts(b: usize, vocab: usize) -> Vec<u32> {
    (0..b)
        .flat_map(|i| (0..PROMPT_LEN).map(move |j| ((i * 31 + j * 7) % vocab) as u32))
        .collect()
}

/// The benchmark training batch: `[b, t]` row-major tokens.
pub fn train_tokens(b: usize, t: usize, vocab: usize) -> Vec<u32> {
    (0..b * t).map(|i| ((i * 7919) % vocab) as u32).collect()
}

/// All-position logits `[b, t, vocab]` of `model` on `tokens` (`[b, t]` row-major).
pub fn logits(model: &Model, tokens: &[u32], b: usize) -> Result<Vec<f32>> {
    let t = tokens.len() / b.max(1);
    let al = ActLayout::for_inference(&model.cfg, b, t, None);
    let mut acts = vec![0.0; al.total_len()];
    crate::forward::forward(model, None, tokens, &al, &mut acts, true)?;
    let lo = al.logits_offset();
    Ok(acts[lo..lo + b * t * model.cfg.vocab_size].to_vec())
}

/// Decode tokens/s for each batch size with a random model of `cfg` (see [`decode_model`]).
pub fn decode(
    cfg: &ModelConfig,
    batches: &[usize],
    new_tokens: usize,
    lim: &Limits,
) -> Result<Vec<DecodeFigure>> {
    let mut p = VecProvider::new();
    let mut model = Model::new_zeroed(cfg.clone(), &mut p)?;
    model.init_random(1, 0.02);
    decode_model(model, &mut p, batches, new_tokens, lim)
}

/// Decode tokens/s of `model` for each batch size: [`prompts`] (16 tokens each), greedy,
/// `new_tokens` generated per row, no stop tokens; prefill time excluded.
pub fn decode_model(
    model: Model,
    p: &mut VecProvider,
    batches: &[usize],
    new_tokens: usize,
    lim: &Limits,
) -> Result<Vec<DecodeFigure>> {
    let vocab = model.cfg.vocab_size;
    let weight_bytes = (model.layout.num_params() * 4) as f64;
    let max_b = batches.iter().copied().max().unwrap_or(1);
    let mut eng = Engine::new(
        model,
        EngineConfig {
            max_batch: max_b,
            max_seq: PROMPT_LEN + new_tokens + 1,
        },
        p,
    )?;
    let mut out = Vec::new();
    for &b in batches {
        let reqs: Vec<GenRequest> = prompts(b, vocab)
            .chunks(PROMPT_LEN)
            .map(|prompt| GenRequest {
                prompt: prompt.to_vec(),
                max_tokens: new_tokens,
                stop_tokens: vec![],
                sampling: SamplingParams {
                    temperature: 0.0,
                    ..Default::default()
                },
                adapter: None,
            })
            .collect();
        // Time prefill (max_tokens = 1) separately and subtract it; best of 3 runs each
        // (the machine is shared, so the minimum is the least disturbed figure).
        let one: Vec<GenRequest> = reqs
            .iter()
            .map(|r| GenRequest {
                max_tokens: 1,
                ..r.clone()
            })
            .collect();
        let mut prefill = f64::MAX;
        let mut total = f64::MAX;
        let mut decoded = 0;
        for _ in 0..3 {
            let t0 = Instant::now();
            eng.generate(&one, false, p)?;
            prefill = prefill.min(t0.elapsed().as_secs_f64());
            let t1 = Instant::now();
            let outs = eng.generate(&reqs, false, p)?;
            total = total.min(t1.elapsed().as_secs_f64());
            decoded = outs.iter().map(|o| o.tokens.len().saturating_sub(1)).sum();
        }
        out.push(DecodeFigure {
            batch: b,
            tokens_per_s: decoded as f64 / (total - prefill).max(1e-9),
            bandwidth_bound_tokens_per_s: b as f64 * lim.memcpy_bytes_per_s / weight_bytes,
            compute_bound_tokens_per_s: lim.gemm_flops / (2.0 * weight_bytes / 4.0),
        });
    }
    Ok(out)
}

/// Train-step timing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainFigure {
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Median seconds per step (forward + SFT loss + backward + clip + AdamW).
    pub median_s: f64,
    /// Lower bound from compute: `(6·params + 12·layers·T·d)·tokens / gemm_flops`.
    pub compute_bound_s: f64,
    /// Loss of the first step (before any update).
    pub first_loss: f64,
    /// Gradient norm of the first step (before clipping).
    pub first_grad_norm: f64,
}

/// Median full-fine-tuning train-step time over `steps` steps on a random batch.
pub fn train_step(
    cfg: &ModelConfig,
    batch: usize,
    seq: usize,
    steps: usize,
    lim: &Limits,
) -> Result<TrainFigure> {
    let mut p = VecProvider::new();
    let mut model = Model::new_zeroed(cfg.clone(), &mut p)?;
    model.init_random(2, 0.02);
    train_step_model(model, &mut p, batch, seq, steps, lim)
}

/// Median train-step time of `model` over `steps` steps (after one warm-up step) on
/// [`train_tokens`]: full fine-tuning, SFT loss over every next token, gradient clipping at
/// 1.0, AdamW with its defaults (lr 1e-3, weight decay 0.01).
pub fn train_step_model(
    model: Model,
    p: &mut VecProvider,
    batch: usize,
    seq: usize,
    steps: usize,
    lim: &Limits,
) -> Result<TrainFigure> {
    let cfg = model.cfg.clone();
    let params = model.layout.num_params() as f64;
    let mut tr = Trainer::new(model, None, AdamW::default(), p)?;
    let toks = train_tokens(batch, seq, cfg.vocab_size);
    let mask = vec![1.0; batch * seq];
    let b = Batch {
        tokens: &toks,
        b: batch,
        t: seq,
        mask: &mask,
    };
    let mut times = Vec::new();
    let mut first = None;
    for _ in 0..steps.max(1) + 1 {
        let t = Instant::now();
        let (loss, step) = tr.train_step(&b, &Loss::Sft, p)?;
        times.push(t.elapsed().as_secs_f64());
        first.get_or_insert((loss.loss, step.grad_norm));
    }
    let (first_loss, first_grad_norm) = first.unwrap_or_default();
    times.remove(0); // warm-up (first-touch of buffers)
    times.sort_by(f64::total_cmp);
    let tokens = (batch * seq) as f64;
    let attn = 12.0 * (cfg.num_hidden_layers * seq * cfg.hidden_size) as f64;
    Ok(TrainFigure {
        batch,
        seq,
        median_s: times[times.len() / 2],
        compute_bound_s: (6.0 * params + attn) * tokens / lim.gemm_flops,
        first_loss,
        first_grad_norm,
    })
}
