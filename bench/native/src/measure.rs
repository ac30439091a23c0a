//! The native side of the measurements: the machine limits, greedy decode tokens/s and the
//! full fine-tuning train-step time of a model, and the inputs and logits candle is checked
//! against (the same prompts and training batch on both sides).

use std::time::Instant;

use tandem_native_core::Result;
use tandem_native_core::acts::ActLayout;
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::engine::{Engine, EngineConfig, GenRequest};
use tandem_native_core::loss::Loss;
use tandem_native_core::model::Model;
use tandem_native_core::optim::AdamW;
use tandem_native_core::sampling::SamplingParams;
use tandem_native_core::trainer::{Batch, Trainer};

/// Prompt length of the decode benchmarks.
pub const PROMPT_LEN: usize = 16;

/// Machine limits measured in this run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Single-thread `copy_from_slice` bandwidth, bytes copied per second.
    pub memcpy_bytes_per_s: f64,
    /// f32 GEMM rate at 512×512×512 through the core's `linalg::linear`, FLOP/s.
    pub gemm_flops: f64,
}

/// Measures [`Limits`] (best of 3 copies of 256 MiB, best of 5 GEMMs).
pub fn limits() -> Limits {
    let n = 64 << 20;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let mut copy = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        copy = copy.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    let m = 512;
    let a = vec![0.5f32; m * m];
    let mut c = vec![0.0f32; m * m];
    let mut gemm = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        tandem_native_core::linalg::linear(&mut c, &a, &a, m, m, m, false);
        gemm = gemm.min(t.elapsed().as_secs_f64());
    }
    Limits {
        memcpy_bytes_per_s: (n * 4) as f64 / copy,
        gemm_flops: 2.0 * (m * m * m) as f64 / gemm,
    }
}

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
#[cfg_attr(not(feature = "candle"), allow(dead_code))]
pub fn logits(model: &Model, tokens: &[u32], b: usize) -> Result<Vec<f32>> {
    let t = tokens.len() / b.max(1);
    let al = ActLayout::for_inference(&model.cfg, b, t, None);
    let mut acts = vec![0.0; al.total_len()];
    tandem_native_core::forward::forward(model, None, tokens, &al, &mut acts, true)?;
    let lo = al.logits_offset();
    Ok(acts[lo..lo + b * t * model.cfg.vocab_size].to_vec())
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

/// Decode tokens/s of `model` for each batch size: [`prompts`], greedy, `new_tokens`
/// generated per row, no stop tokens; best of 3, prefill (timed alone) subtracted.
pub fn decode(
    model: Model,
    p: &mut VecProvider,
    batches: &[usize],
    new_tokens: usize,
    lim: &Limits,
) -> Result<Vec<DecodeFigure>> {
    let vocab = model.cfg.vocab_size;
    let weight_bytes = (model.layout.num_params() * 4) as f64;
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let max_seq = PROMPT_LEN + new_tokens + 1;
    let mut eng = Engine::new(model, EngineConfig { max_batch, max_seq }, p)?;
    let mut out = Vec::new();
    for &b in batches {
        let reqs = requests(&prompts(b, vocab), new_tokens);
        let prefill_only = requests(&prompts(b, vocab), 1);
        let (mut prefill, mut total, mut decoded) = (f64::MAX, f64::MAX, 0);
        for _ in 0..3 {
            let t0 = Instant::now();
            eng.generate(&prefill_only, false, p)?;
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

/// Greedy requests over `[n, PROMPT_LEN]` prompts.
fn requests(prompts: &[u32], max_tokens: usize) -> Vec<GenRequest> {
    prompts
        .chunks(PROMPT_LEN)
        .map(|prompt| GenRequest {
            prompt: prompt.to_vec(),
            max_tokens,
            stop_tokens: vec![],
            sampling: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            adapter: None,
        })
        .collect()
}

/// Train-step timing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainFigure {
    /// Median seconds per step (forward + SFT loss + backward + clip + AdamW).
    pub median_s: f64,
    /// Lower bound from compute: `(6·params + 12·layers·T·d)·tokens / gemm_flops`.
    pub compute_bound_s: f64,
    /// Loss of the first step (before any update).
    pub first_loss: f64,
    /// Gradient norm of the first step (before clipping).
    pub first_grad_norm: f64,
}

/// Median train-step time of `model` over `steps` steps (after one warm-up step) on
/// [`train_tokens`] `[batch, seq]`: full fine-tuning, SFT loss over every next token, gradient
/// clipping at 1.0, AdamW with its defaults (lr 1e-3, weight decay 0.01).
pub fn train_step(
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
    let tokens = train_tokens(batch, seq, cfg.vocab_size);
    let mask = vec![1.0; batch * seq];
    let b = Batch {
        tokens: &tokens,
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
    times.remove(0); // warm-up (first touch of the buffers)
    let n_tokens = (batch * seq) as f64;
    let attn = 12.0 * (cfg.num_hidden_layers * seq * cfg.hidden_size) as f64;
    Ok(TrainFigure {
        median_s: median(&mut times),
        compute_bound_s: (6.0 * params + attn) * n_tokens / lim.gemm_flops,
        first_loss,
        first_grad_norm,
    })
}

/// The median of `v` (sorted in place; NaN when empty).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
