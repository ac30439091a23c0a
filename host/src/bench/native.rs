//! `tandem bench native`: decode tokens/s (batch 1, 8, 64) and the full fine-tuning train-step
//! time (batch 8 × 64 tokens, SFT, clip 1.0, AdamW) of the native core on the `tiny` and
//! `small` init presets.
//!
//! Built with the `candle` feature (`cargo run --release -p tandem-host --features candle --
//! bench native`), candle 0.11 runs the SAME safetensors in the same run and is the limit of
//! each figure: decode through candle-transformers' own Llama (greedy, its KV cache), the train
//! step through the same architecture written with candle's differentiable ops + autograd +
//! `candle_nn::AdamW`. Before timing, both candle models' logits are checked against native's
//! (≤ 1e-4) and the first step's loss and gradient norm are compared, so the figures are of the
//! same model and the same work. Targets: decode ≥ 1.0× candle, train step ≤ 1.0× candle's
//! time. Without the feature the limits are the machine bounds (memcpy bandwidth for decode,
//! GEMM rate for training) and one line says how to include candle.

use std::path::{Path, PathBuf};

use tandem_plugin_native::bench as nb;
use tandem_plugin_native::buffer::VecProvider;
use tandem_plugin_native::init::{Preset, init_preset};
use tandem_plugin_native::model::Model;

use super::Figure;
use crate::error::HostError;

/// Decode batch sizes.
const BATCHES: [usize; 3] = [1, 8, 64];
/// Train-step batch: sequences × tokens.
const TRAIN_B: usize = 8;
const TRAIN_T: usize = 64;
/// Largest max |Δ| of logits accepted as "the same model".
#[cfg(feature = "candle")]
const LOGITS_TOL: f32 = 1e-4;

fn native_err(what: &str) -> impl Fn(tandem_plugin_native::error::NativeError) -> HostError {
    let what = what.to_owned();
    move |e| HostError::Runtime(format!("bench native: {what}: {e}"))
}

/// Scratch model directory for one preset, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the benchmark; `quick` generates 16 instead of 64 tokens and times 2 instead of 5
/// train steps.
pub fn run(quick: bool) -> Result<Vec<Figure>, HostError> {
    let lim = nb::limits();
    let new_tokens = if quick { 16 } else { 64 };
    let steps = if quick { 2 } else { 5 };
    let mut figures = Vec::new();
    for (name, preset) in [("tiny", Preset::Tiny), ("small", Preset::Small)] {
        let dir = Scratch(
            std::env::temp_dir().join(format!("tandem-bench-native-{}-{name}", std::process::id())),
        );
        let mut p = VecProvider::new();
        let model = init_preset(preset, &dir.0, 7, &mut p).map_err(native_err("init preset"))?;
        #[cfg(feature = "candle")]
        figures.extend(candle::check(name, &dir.0, &model)?);
        let decode = nb::decode_model(model, &mut p, &BATCHES, new_tokens, &lim)
            .map_err(native_err("decode"))?;
        #[cfg(feature = "candle")]
        let limits: Vec<(f64, &str, &str)> = candle::decode(&dir.0, new_tokens)?
            .into_iter()
            .map(|c| (c, "candle 0.11", ">= 1.0"))
            .collect();
        #[cfg(not(feature = "candle"))]
        let limits: Vec<(f64, &str, &str)> = decode
            .iter()
            .map(|f| {
                let bound = f
                    .bandwidth_bound_tokens_per_s
                    .min(f.compute_bound_tokens_per_s);
                (bound, "memcpy/GEMM bound", "")
            })
            .collect();
        for (f, (limit, limit_name, target)) in decode.iter().zip(limits) {
            let case = format!("{name} decode b{}", f.batch);
            figures.push(
                Figure::new("native", &case, f.tokens_per_s, "tok/s", limit)
                    .limit_name(limit_name)
                    .target(target),
            );
        }
        let model = load(&dir.0, &mut p)?;
        let train = nb::train_step_model(model, &mut p, TRAIN_B, TRAIN_T, steps, &lim)
            .map_err(native_err("train step"))?;
        let case = format!("{name} train step b{TRAIN_B}x{TRAIN_T}");
        #[cfg(feature = "candle")]
        {
            let c = candle::train(&dir.0, steps)?;
            candle::same_step(name, &train, &c)?;
            figures.push(
                Figure::new("native", &case, train.median_s, "s", c.median_s)
                    .limit_name("candle 0.11")
                    .target("<= 1.0"),
            );
        }
        #[cfg(not(feature = "candle"))]
        figures.push(
            Figure::new("native", &case, train.median_s, "s", train.compute_bound_s)
                .limit_name("GEMM bound"),
        );
    }
    #[cfg(not(feature = "candle"))]
    eprintln!(
        "candle not included; to time candle 0.11 on the same models: \
         cargo run --release -p tandem-host --features candle -- bench native"
    );
    Ok(figures)
}

fn load(dir: &Path, p: &mut VecProvider) -> Result<Model, HostError> {
    Model::load(dir, p).map_err(native_err("load model"))
}

#[cfg(feature = "candle")]
mod candle {
    //! The candle side of `tandem bench native` (feature `candle`).

    use std::path::Path;

    use tandem_candle_ref::{InferModel, RefError, TrainModel};
    use tandem_plugin_native::bench as nb;
    use tandem_plugin_native::model::Model;

    use super::{BATCHES, Figure, LOGITS_TOL, TRAIN_B, TRAIN_T, native_err};
    use crate::error::HostError;

    fn err(e: RefError) -> HostError {
        HostError::Runtime(format!("bench native: candle: {e}"))
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

    /// Logits of both candle models against native's on the same prompts; fails above
    /// [`LOGITS_TOL`]. Returns the two max |Δ| as figures.
    pub(super) fn check(name: &str, dir: &Path, model: &Model) -> Result<Vec<Figure>, HostError> {
        let (b, v) = (2, model.cfg.vocab_size);
        let t = nb::PROMPT_LEN;
        let toks = nb::prompts(b, v);
        let extra: Vec<u32> = vec![3, 5];
        let ours = nb::logits(model, &toks, b).map_err(native_err("logits"))?;
        let mut longer = Vec::new();
        for (row, e) in toks.chunks(t).zip(&extra) {
            longer.extend_from_slice(row);
            longer.push(*e);
        }
        let ours_next = nb::logits(model, &longer, b).map_err(native_err("logits"))?;
        let last = |all: &[f32], t: usize| -> Vec<f32> {
            (0..b)
                .flat_map(|r| all[(r * t + t - 1) * v..(r * t + t) * v].iter().copied())
                .collect()
        };
        let cand = InferModel::load(dir)
            .map_err(err)?
            .logits(&toks, b, &extra)
            .map_err(err)?;
        let d_infer =
            max_diff(&last(&ours, t), &cand[0]).max(max_diff(&last(&ours_next, t + 1), &cand[1]));
        let d_train = max_diff(
            &ours,
            &TrainModel::load(dir, 1e-3, 0.01, 1.0)
                .map_err(err)?
                .logits(&toks, b)
                .map_err(err)?,
        );
        for (what, d) in [
            ("candle-transformers model", d_infer),
            ("candle autograd model", d_train),
        ] {
            if d.is_nan() || d > LOGITS_TOL {
                return Err(HostError::Runtime(format!(
                    "bench native: {name}: logits of the {what} differ from native's by {d:e} \
                     (> {LOGITS_TOL:e}); the timing would not compare the same model"
                )));
            }
        }
        Ok(vec![
            Figure::new(
                "native",
                &format!("{name} logits max|Δ| vs candle-transformers (prefill + cached step)"),
                d_infer as f64 * 1e6,
                "e-6",
                LOGITS_TOL as f64 * 1e6,
            )
            .limit_name("tolerance")
            .target("<= 1.0"),
            Figure::new(
                "native",
                &format!("{name} logits max|Δ| vs candle autograd model"),
                d_train as f64 * 1e6,
                "e-6",
                LOGITS_TOL as f64 * 1e6,
            )
            .limit_name("tolerance")
            .target("<= 1.0"),
        ])
    }

    /// candle-transformers greedy decode tokens/s per batch of [`BATCHES`] (best of 3; prefill
    /// excluded).
    pub(super) fn decode(dir: &Path, new_tokens: usize) -> Result<Vec<f64>, HostError> {
        let mut m = InferModel::load(dir).map_err(err)?;
        let v = m.cfg.vocab_size;
        let mut out = Vec::new();
        for b in BATCHES {
            let prompts = nb::prompts(b, v);
            let mut best = f64::MAX;
            for _ in 0..3 {
                let d = m.generate_greedy(&prompts, b, new_tokens).map_err(err)?;
                best = best.min(d.decode_s);
            }
            out.push((b * new_tokens.saturating_sub(1)) as f64 / best.max(1e-9));
        }
        Ok(out)
    }

    /// candle's train step: median seconds over `steps` (after one warm-up), and the first
    /// step's loss and gradient norm.
    pub(super) struct Train {
        pub(super) median_s: f64,
        first_loss: f32,
        first_grad_norm: f32,
    }

    pub(super) fn train(dir: &Path, steps: usize) -> Result<Train, HostError> {
        let mut m = TrainModel::load(dir, 1e-3, 0.01, 1.0).map_err(err)?;
        let toks = nb::train_tokens(TRAIN_B, TRAIN_T, m.cfg.vocab_size);
        let mut times = Vec::new();
        let mut first = None;
        for _ in 0..steps.max(1) + 1 {
            let t = std::time::Instant::now();
            let r = m.train_step(&toks, TRAIN_B).map_err(err)?;
            times.push(t.elapsed().as_secs_f64());
            first.get_or_insert(r);
        }
        times.remove(0);
        times.sort_by(f64::total_cmp);
        let first = first.unwrap_or(tandem_candle_ref::StepReport {
            loss: f32::NAN,
            grad_norm: f32::NAN,
        });
        Ok(Train {
            median_s: times[times.len() / 2],
            first_loss: first.loss,
            first_grad_norm: first.grad_norm,
        })
    }

    /// The first step's loss and gradient norm must agree (relative 1e-3): same data, same
    /// loss, same gradients.
    pub(super) fn same_step(name: &str, n: &nb::TrainFigure, c: &Train) -> Result<(), HostError> {
        let rel = |a: f64, b: f64| (a - b).abs() / a.abs().max(b.abs()).max(1e-12);
        let dl = rel(n.first_loss, c.first_loss as f64);
        let dg = rel(n.first_grad_norm, c.first_grad_norm as f64);
        eprintln!(
            "{name}: first train step native loss {:.6} grad-norm {:.6} | candle loss {:.6} grad-norm {:.6}",
            n.first_loss, n.first_grad_norm, c.first_loss, c.first_grad_norm
        );
        if dl.is_nan() || dg.is_nan() || dl > 1e-3 || dg > 1e-3 {
            return Err(HostError::Runtime(format!(
                "bench native: {name}: first train step differs from candle's (loss rel {dl:e}, \
                 grad-norm rel {dg:e}); the timing would not compare the same work"
            )));
        }
        Ok(())
    }
}
