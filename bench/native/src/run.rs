//! The benchmark: for each selected init preset, the model is written to a scratch directory
//! (`init_preset`, seed 7), then decode tokens/s at batch 1, 8 and 64 and the full fine-tuning
//! train-step time (batch 8 × 64 tokens) are measured, each as a [`Figure`] beside its limit:
//! candle 0.11 on the same files with feature `candle` (after checking both compute the same
//! logits and the same first step), the machine bounds otherwise.

use std::path::{Path, PathBuf};

use tandem_bench_report::Figure;
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::init::{Preset, init_preset};
use tandem_native_core::model::Model;

use crate::error::{BenchError, native};
use crate::measure::{self, Limits};

/// Decode batch sizes.
pub const BATCHES: [usize; 3] = [1, 8, 64];
/// Train-step batch: sequences × tokens.
pub const TRAIN_B: usize = 8;
/// Tokens per training sequence.
pub const TRAIN_T: usize = 64;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Presets to measure, in order.
    pub presets: Vec<Preset>,
    /// Model directories (Hugging Face layout) to measure after the presets.
    pub models: Vec<PathBuf>,
    /// Measure decode.
    pub decode: bool,
    /// Measure the train step.
    pub train: bool,
    /// 16 instead of 64 generated tokens, 2 instead of 5 timed train steps.
    pub quick: bool,
}

/// Scratch model directory for one preset, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the selection; progress goes to stderr.
pub fn run(sel: &Selection) -> Result<Vec<Figure>, BenchError> {
    let lim = measure::limits();
    eprintln!(
        "limits: memcpy {:.1} GB/s, gemm {:.1} GFLOP/s, {} rayon threads",
        lim.memcpy_bytes_per_s / 1e9,
        lim.gemm_flops / 1e9,
        rayon::current_num_threads()
    );
    let mut figures = Vec::new();
    for &preset in &sel.presets {
        figures.extend(one_preset(preset, sel, &lim)?);
    }
    for dir in &sel.models {
        let name = dir
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
        let mut p = VecProvider::new();
        let model = Model::load(dir, &mut p).map_err(native("load model"))?;
        figures.extend(one_model(&name, dir, model, &mut p, sel, &lim)?);
    }
    if !cfg!(feature = "candle") {
        eprintln!(
            "candle not included; to time candle 0.11 on the same models: \
             cargo run --release -p tandem-bench-native --features candle"
        );
    }
    Ok(figures)
}

fn one_preset(preset: Preset, sel: &Selection, lim: &Limits) -> Result<Vec<Figure>, BenchError> {
    let name = preset.name();
    let dir = Scratch(
        std::env::temp_dir().join(format!("tandem-bench-native-{}-{name}", std::process::id())),
    );
    eprintln!("{name}: writing the init preset to {}", dir.0.display());
    let mut p = VecProvider::new();
    let model = init_preset(preset, &dir.0, 7, &mut p).map_err(native("init preset"))?;
    one_model(name, &dir.0, model, &mut p, sel, lim)
}

/// Decode and train-step figures of the model in `dir` (already loaded as `model`).
fn one_model(
    name: &str,
    dir: &Path,
    model: Model,
    p: &mut VecProvider,
    sel: &Selection,
    lim: &Limits,
) -> Result<Vec<Figure>, BenchError> {
    let new_tokens = if sel.quick { 16 } else { 64 };
    let steps = if sel.quick { 2 } else { 5 };
    let mut figures = Vec::new();
    #[cfg(feature = "candle")]
    figures.extend(crate::candle::check(name, dir, &model)?);
    if sel.decode {
        eprintln!("{name}: decode at batch {BATCHES:?}, {new_tokens} new tokens");
        let decode =
            measure::decode(model, p, &BATCHES, new_tokens, lim).map_err(native("decode"))?;
        #[cfg(feature = "candle")]
        let limits: Vec<(f64, &str, &str)> = crate::candle::decode(dir, new_tokens)?
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
    } else {
        drop(model);
    }
    if sel.train {
        eprintln!("{name}: train step b{TRAIN_B}x{TRAIN_T}, {steps} timed steps");
        figures.push(train(name, dir, p, steps, lim)?);
    }
    Ok(figures)
}

fn train(
    name: &str,
    dir: &Path,
    p: &mut VecProvider,
    steps: usize,
    lim: &Limits,
) -> Result<Figure, BenchError> {
    let model = Model::load(dir, p).map_err(native("load model"))?;
    let train = measure::train_step(model, p, TRAIN_B, TRAIN_T, steps, lim)
        .map_err(native("train step"))?;
    let case = format!("{name} train step b{TRAIN_B}x{TRAIN_T}");
    #[cfg(feature = "candle")]
    {
        let c = crate::candle::train(dir, steps)?;
        crate::candle::same_step(name, &train, &c)?;
        Ok(
            Figure::new("native", &case, train.median_s, "s", c.median_s)
                .limit_name("candle 0.11")
                .target("<= 1.0"),
        )
    }
    #[cfg(not(feature = "candle"))]
    Ok(
        Figure::new("native", &case, train.median_s, "s", train.compute_bound_s)
            .limit_name("GEMM bound"),
    )
}
