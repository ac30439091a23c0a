//! `tandem bench trainers`: one GRPO step on the same batch through every trainer that is
//! there — the native trainer in process, the `fsdp` trainer (PyTorch FSDP2, 1 and 2 gloo
//! ranks) and the `megatron` trainer (Megatron-Core, TP=1 and TP=2) — on the `tiny` and
//! `small` presets, each figure beside its peer measured in the same run:
//!
//! - `PRESET megatron tp=N step` beside `fsdp` with N ranks (same batch, same ranks);
//! - `PRESET fsdp ranks=N step` beside the native trainer's step;
//! - `PRESET native step` beside `fsdp` with 1 rank (torch on one process).
//!
//! The batch: 8 sequences × 64 tokens (16 prompt + 48 completion), groups of 4 with rewards
//! 0/1 (advantages ±1), behaviour logprobs computed beforehand, clip 0.2, grad clip 1.0, no
//! KL, AdamW; one warm-up step, then the median of 3 (`--quick`: `tiny` only, 1 timed step).
//! The first step's loss and gradient norm of every trainer go to stderr: the same batch
//! gives the same numbers. Torch threads: cores ÷ ranks per rank.
//!
//! The torchrun rows need `$TANDEM_PYTHON` (or the venv `scripts/setup-python.sh` records)
//! and the plugin libraries in a plugin directory (`--plugin-dir`, `TANDEM_PLUGIN_PATH`); a
//! trainer that is not there is skipped with one line saying why.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::Figure;
use super::native::{STEP_B, STEP_T, median, step_samples};
use serde_json::json;
use tandem_cli::error::CliError;
use tandem_plugin_api::{ComponentConfig, ComponentKind, Metric, TrainBatch, WhichWeights};
use tandem_rl::algorithm::grpo;
use tandem_rl::warmstart::create_preset;
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;
use tandem_runtime::role::{Local, Trainer};
use tandem_runtime::services::Services;

const BENCH: &str = "trainers";
const LR: f32 = 1e-5;

/// One trainer of the comparison: plugin component, options, its name in the figures.
struct Case {
    component: &'static str,
    options: serde_json::Value,
    name: String,
}

fn cases() -> Vec<Case> {
    let mut v = vec![Case {
        component: "native",
        options: json!({"digest": false}),
        name: "native".into(),
    }];
    for n in [1, 2] {
        v.push(Case {
            component: "fsdp",
            options: json!({"ranks": n}),
            name: format!("fsdp ranks={n}"),
        });
    }
    for n in [1, 2] {
        v.push(Case {
            component: "megatron",
            options: json!({"tp": n}),
            name: format!("megatron tp={n}"),
        });
    }
    v
}

/// The measured step of one case.
struct Step {
    seconds: f64,
    first: Vec<Metric>,
}

/// Runs the benchmark.
pub fn run(cli_dirs: &[PathBuf], quick: bool) -> Result<Vec<Figure>, CliError> {
    let scratch =
        std::env::temp_dir().join(format!("tandem-bench-trainers-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(CliError::io(format!(
        "tandem bench trainers: creating {}",
        scratch.display()
    )))?;
    let out = run_in(&scratch, cli_dirs, quick);
    let _ = std::fs::remove_dir_all(&scratch);
    out
}

fn run_in(scratch: &Path, cli_dirs: &[PathBuf], quick: bool) -> Result<Vec<Figure>, CliError> {
    let dirs = tandem_runtime::registry::plugin_dirs(cli_dirs, &[]);
    let registry = Registry::discover(&dirs).map_err(RuntimeError::Plugins)?;
    let present = registry.component_names(ComponentKind::Trainer);
    let presets: &[&str] = if quick { &["tiny"] } else { &["tiny", "small"] };
    let timed = if quick { 1 } else { 3 };
    let mut figures = Vec::new();
    for preset in presets {
        let model = scratch.join(format!("model-{preset}"));
        create_preset(&registry, &model, preset, 7)?;
        let mut steps: Vec<(String, Step)> = Vec::new();
        for case in cases() {
            if !present.iter().any(|n| n == case.component) {
                eprintln!(
                    "tandem bench trainers: {preset} {} skipped: no plugin provides the trainer \
                     `{}` (cargo build -p tandem-plugin-{}; name its directory with --plugin-dir)",
                    case.name, case.component, case.component
                );
                continue;
            }
            match step(&registry, &model, scratch, &case, timed) {
                Ok(s) => {
                    eprintln!(
                        "tandem bench trainers: {preset} {}: {:.3} s; first step loss {:.6}, \
                         grad norm {:.6}",
                        case.name,
                        s.seconds,
                        metric(&s.first, "loss"),
                        metric(&s.first, "grad_norm")
                    );
                    steps.push((case.name, s));
                }
                // A torchrun trainer without its Python is skipped with the reason; the native
                // trainer failing is the bench failing.
                Err(e) if case.component != "native" => {
                    eprintln!("tandem bench trainers: {preset} {} skipped: {e}", case.name);
                }
                Err(e) => return Err(e),
            }
        }
        figures.extend(rows(preset, &steps));
    }
    Ok(figures)
}

fn rows(preset: &str, steps: &[(String, Step)]) -> Vec<Figure> {
    let find = |name: &str| {
        steps
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.seconds)
    };
    steps
        .iter()
        .map(|(name, s)| {
            let peer = if let Some(n) = name.strip_prefix("megatron tp=") {
                format!("fsdp ranks={n}")
            } else if name.starts_with("fsdp") {
                "native".to_string()
            } else {
                "fsdp ranks=1".to_string()
            };
            let limit = find(&peer).unwrap_or(f64::NAN);
            let case = format!("{preset} {name} grpo step b{STEP_B}x{STEP_T}");
            Figure::new(BENCH, &case, s.seconds, "s", limit)
                .limit_name(&format!("{peer} step, same batch"))
        })
        .collect()
}

fn metric(m: &[Metric], name: &str) -> f64 {
    m.iter()
        .find(|x| x.name.as_str() == name)
        .map_or(f64::NAN, |x| x.value)
}

fn step(
    registry: &Registry,
    model: &Path,
    scratch: &Path,
    case: &Case,
    timed: usize,
) -> Result<Step, CliError> {
    let run_dir = scratch.join(case.name.replace([' ', '='], "-"));
    let config = ComponentConfig {
        component: case.component.into(),
        model_path: model.display().to_string().into(),
        options_json: case.options.to_string().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: run_dir.display().to_string().into(),
    };
    let services = Services::new();
    let mut trainer = Local(registry.new_trainer(config, services.handle())?);
    trainer.init()?;
    let batch = grpo_batch(&mut trainer, model)?;
    let first = trainer.train_step(batch.clone())?;
    let mut seconds = Vec::new();
    for _ in 0..timed {
        let t = Instant::now();
        trainer.train_step(batch.clone())?;
        seconds.push(t.elapsed().as_secs_f64());
    }
    Ok(Step {
        seconds: median(seconds),
        first,
    })
}

/// The step's batch: rows of token ids spread over the vocabulary, rewards 0/1 per group, the
/// behaviour logprobs of the trainer's starting weights (what the engine would return).
fn grpo_batch(
    trainer: &mut Local<tandem_plugin_api::TrainerBox>,
    model: &Path,
) -> Result<TrainBatch, CliError> {
    let vocab = vocab_size(model)?;
    let mut samples = step_samples(vocab);
    let adv = grpo::advantages(&samples);
    let loss = grpo::loss(LR, 0.2, 0.0, 1.0);
    let probe = grpo::batch(&samples, &adv, loss.clone(), true);
    let old = trainer.compute_logprobs(probe, WhichWeights::Current)?;
    for (s, lp) in samples.iter_mut().zip(old) {
        s.logprobs = lp;
    }
    Ok(grpo::batch(&samples, &adv, loss, true))
}

fn vocab_size(model: &Path) -> Result<usize, CliError> {
    let path = model.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(CliError::io(format!(
        "tandem bench trainers: reading {}",
        path.display()
    )))?;
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["vocab_size"].as_u64())
        .map(|v| v as usize)
        .ok_or_else(|| {
            CliError::failed(format!(
                "tandem bench trainers: {} has no vocab_size",
                path.display()
            ))
        })
}
