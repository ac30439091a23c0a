//! The candle side (feature `candle`): candle 0.11 runs the SAME safetensors — decode through
//! candle-transformers' own Llama (greedy, its KV cache), the train step through the same
//! architecture written with candle's differentiable ops + autograd + `candle_nn::AdamW`.
//! Before anything is timed, both candle models' logits are checked against native's
//! (≤ [`LOGITS_TOL`]) and the first step's loss and gradient norm are compared (relative 1e-3),
//! so the figures are of the same model and the same work.

use std::path::Path;

use tandem_bench_report::Figure;
use tandem_candle_ref::{InferModel, RefError, StepReport, TrainModel};
use tandem_native_core::model::Model;

use crate::error::{BenchError, native};
use crate::measure::{self, PROMPT_LEN, TrainFigure};
use crate::run::{BATCHES, TRAIN_B, TRAIN_T};

/// Largest max |Δ| of logits accepted as "the same model".
pub const LOGITS_TOL: f32 = 1e-4;

fn err(e: RefError) -> BenchError {
    BenchError::Candle(e.to_string())
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Logits of both candle models against native's on the same prompts (prefill, then one
/// cached step); fails above [`LOGITS_TOL`]. Returns the two max |Δ| as figures.
pub fn check(name: &str, dir: &Path, model: &Model) -> Result<Vec<Figure>, BenchError> {
    let (b, v, t) = (2, model.cfg.vocab_size, PROMPT_LEN);
    let toks = measure::prompts(b, v);
    let extra: Vec<u32> = vec![3, 5];
    let ours = measure::logits(model, &toks, b).map_err(native("logits"))?;
    let mut longer = Vec::new();
    for (row, e) in toks.chunks(t).zip(&extra) {
        longer.extend_from_slice(row);
        longer.push(*e);
    }
    let ours_next = measure::logits(model, &longer, b).map_err(native("logits"))?;
    let last = |all: &[f32], t: usize| -> Vec<f32> {
        (0..b)
            .flat_map(|r| all[(r * t + t - 1) * v..(r * t + t) * v].iter().copied())
            .collect()
    };
    let cand = InferModel::load(dir)
        .map_err(err)?
        .logits(&toks, b, &extra)
        .map_err(err)?;
    let (first, next) = match cand.as_slice() {
        [first, next, ..] => (first, next),
        _ => return Err(BenchError::Candle("logits: expected two steps".into())),
    };
    let d_infer = max_diff(&last(&ours, t), first).max(max_diff(&last(&ours_next, t + 1), next));
    let d_train = max_diff(
        &ours,
        &TrainModel::load(dir, 1e-3, 0.01, 1.0)
            .map_err(err)?
            .logits(&toks, b)
            .map_err(err)?,
    );
    let mut figures = Vec::new();
    for (what, d) in [
        ("candle-transformers model", d_infer),
        ("candle autograd model", d_train),
    ] {
        if d.is_nan() || d > LOGITS_TOL {
            return Err(BenchError::Mismatch(format!(
                "{name}: logits of the {what} differ from native's by {d:e} (> {LOGITS_TOL:e}); \
                 the timing would not compare the same model"
            )));
        }
    }
    for (case, d) in [
        ("candle-transformers (prefill + cached step)", d_infer),
        ("candle autograd model", d_train),
    ] {
        figures.push(
            Figure::new(
                "native",
                &format!("{name} logits max|Δ| vs {case}"),
                d as f64 * 1e6,
                "e-6",
                LOGITS_TOL as f64 * 1e6,
            )
            .limit_name("tolerance")
            .target("<= 1.0"),
        );
    }
    Ok(figures)
}

/// candle-transformers greedy decode tokens/s per batch of [`BATCHES`] (best of 3; prefill
/// excluded).
pub fn decode(dir: &Path, new_tokens: usize) -> Result<Vec<f64>, BenchError> {
    let mut m = InferModel::load(dir).map_err(err)?;
    let v = m.cfg.vocab_size;
    let mut out = Vec::new();
    for b in BATCHES {
        let prompts = measure::prompts(b, v);
        let mut best = f64::MAX;
        for _ in 0..3 {
            let d = m.generate_greedy(&prompts, b, new_tokens).map_err(err)?;
            best = best.min(d.decode_s);
        }
        out.push((b * new_tokens.saturating_sub(1)) as f64 / best.max(1e-9));
    }
    Ok(out)
}

/// candle's train step: median seconds over the timed steps, and the first step's report.
pub struct Train {
    /// Median seconds per step (after one warm-up step).
    pub median_s: f64,
    first: StepReport,
}

/// Times `steps` candle train steps (after one warm-up) on the bench's training batch.
pub fn train(dir: &Path, steps: usize) -> Result<Train, BenchError> {
    let mut m = TrainModel::load(dir, 1e-3, 0.01, 1.0).map_err(err)?;
    let toks = measure::train_tokens(TRAIN_B, TRAIN_T, m.cfg.vocab_size);
    let mut times = Vec::new();
    let mut first = None;
    for _ in 0..steps.max(1) + 1 {
        let t = std::time::Instant::now();
        let r = m.train_step(&toks, TRAIN_B).map_err(err)?;
        times.push(t.elapsed().as_secs_f64());
        first.get_or_insert(r);
    }
    times.remove(0);
    Ok(Train {
        median_s: measure::median(&mut times),
        first: first.unwrap_or(StepReport {
            loss: f32::NAN,
            grad_norm: f32::NAN,
        }),
    })
}

/// The first step's loss and gradient norm must agree (relative 1e-3): same data, same loss,
/// same gradients.
pub fn same_step(name: &str, n: &TrainFigure, c: &Train) -> Result<(), BenchError> {
    let rel = |a: f64, b: f64| (a - b).abs() / a.abs().max(b.abs()).max(1e-12);
    let dl = rel(n.first_loss, c.first.loss as f64);
    let dg = rel(n.first_grad_norm, c.first.grad_norm as f64);
    eprintln!(
        "{name}: first train step native loss {:.6} grad-norm {:.6} | candle loss {:.6} grad-norm {:.6}",
        n.first_loss, n.first_grad_norm, c.first.loss, c.first.grad_norm
    );
    if dl.is_nan() || dg.is_nan() || dl > 1e-3 || dg > 1e-3 {
        return Err(BenchError::Mismatch(format!(
            "{name}: first train step differs from candle's (loss rel {dl:e}, grad-norm rel \
             {dg:e}); the timing would not compare the same work"
        )));
    }
    Ok(())
}
