//! The drafter of `bench spec`, trained in this process: the target's greedy continuations of
//! the training prompts (a fixed pool, generated once by a `native` engine), their features
//! from the engine's `hidden_states` (`Inline`, computed once per batch of the pool and
//! reused every epoch), `train_step_features` on the `native-drafter` trainer, then
//! `save_checkpoint`.

use std::path::{Path, PathBuf};

use super::{BENCH, Ctx, Plan, TRAIN_SEED, prompts};
use crate::Figure;
use crate::native::{config, greedy, metric};
use serde_json::json;
use tandem_cli::error::CliError;
use tandem_plugin_api::{
    ComponentConfig, FeatureBatch, FeatureRoute, FeatureSource, HiddenStatesRequest, LossConfig,
    LossKind, Metric, ROption, RVec, TrainBatch, TrainSequence,
};
use tandem_runtime::role::{Engine, Local, Trainer};
use tandem_runtime::services::Services;

/// Learning rate of the drafter's AdamW, decayed linearly to a tenth over the run.
const LR: f32 = 2e-3;
/// Draft positions trained per step (EAGLE-3's training-time test).
const TTT_STEPS: usize = 4;
/// Sequences a generate call of the data engine carries.
const GEN_BATCH: usize = 16;

/// A trained drafter.
pub(super) struct Drafted {
    /// Its checkpoint directory.
    pub dir: PathBuf,
    /// Mean accuracy of each draft position over the last epoch's steps.
    pub acc: Vec<f64>,
}

impl Drafted {
    /// The training-accuracy figure: the first draft position's accuracy beside 1.
    pub fn figure(&self, name: &str) -> Figure {
        let acc0 = self.acc.first().copied().unwrap_or(f64::NAN);
        Figure::new(BENCH, &format!("{name} drafter train acc_0"), acc0, "", 1.0)
            .limit_name("every draft right")
    }
}

/// The `native-drafter` trainer's configuration for `model`.
pub(super) fn drafter_config(model: &Path, options: serde_json::Value) -> ComponentConfig {
    ComponentConfig {
        component: "native-drafter".into(),
        ..config(model, options)
    }
}

/// The drafter's input layers and feature width, as the trainer reports them.
pub(super) fn drafter_inputs(stats: &[Metric]) -> Result<(Vec<u32>, u32), CliError> {
    let mut layers = Vec::new();
    loop {
        let v = metric(stats, &format!("drafter.aux_layer.{}", layers.len()));
        if v.is_nan() {
            break;
        }
        layers.push(v as u32);
    }
    let width = metric(stats, "drafter.feature_width");
    if layers.is_empty() || width.is_nan() || width <= 0.0 {
        return Err(CliError::failed(
            "tandem bench spec: the native-drafter trainer reports no drafter.aux_layer.<i> / \
             drafter.feature_width",
        ));
    }
    Ok((layers, width as u32))
}

/// A training sequence: prompt + greedy continuation.
struct Seq {
    tokens: Vec<u32>,
    prompt_len: u32,
}

/// Trains the drafter of `model` as `plan` says and saves it under the scratch directory.
pub(super) fn train(ctx: &Ctx<'_>, model: &Path, plan: &Plan) -> Result<Drafted, CliError> {
    let name = plan.name;
    let prompts = prompts(model, TRAIN_SEED, plan.pool)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let seq_len = longest + plan.train_tokens;
    let services = Services::new();
    let engine = Local(ctx.registry.new_engine(
        config(
            model,
            json!({"max_batch": GEN_BATCH, "max_seq_len": seq_len + 1}),
        ),
        services.handle(),
    )?);
    let mut seqs = Vec::with_capacity(prompts.len());
    for chunk in prompts.chunks(GEN_BATCH) {
        let out = engine.generate(greedy(chunk, plan.train_tokens))?;
        for (p, c) in chunk.iter().zip(out.completions.iter()) {
            let mut tokens = p.clone();
            tokens.extend_from_slice(&c.tokens);
            seqs.push(Seq {
                tokens,
                prompt_len: p.len() as u32,
            });
        }
    }
    let options = json!({
        "ttt_steps": TTT_STEPS,
        "max_tokens": plan.batch * seq_len,
        "seed": 1,
    });
    let trainer_services = Services::new();
    let mut trainer = Local(
        ctx.registry
            .new_trainer(drafter_config(model, options), trainer_services.handle())?,
    );
    let info = trainer.init()?;
    let (layers, width) = drafter_inputs(&trainer.stats()?.metrics)?;
    eprintln!(
        "spec: {name}: drafter of {} trainable parameters on layers {layers:?}; {} steps of \
         {} sequences from a pool of {} ({} prompt + {} generated tokens at most)",
        info.trainable_params,
        plan.steps,
        plan.batch,
        seqs.len(),
        longest,
        plan.train_tokens
    );
    let batches: Vec<&[Seq]> = seqs.chunks(plan.batch).collect();
    let mut features: Vec<Option<Vec<f32>>> = vec![None; batches.len()];
    let mut acc = Vec::new();
    let last_epoch = plan.steps.saturating_sub(batches.len());
    for step in 0..plan.steps {
        let i = step % batches.len();
        let batch = batches[i];
        if features[i].is_none() {
            let report = engine.hidden_states(HiddenStatesRequest {
                sequences: batch.iter().map(|s| RVec::from(s.tokens.clone())).collect(),
                layers: RVec::from(layers.clone()),
                adapter: ROption::RNone,
                route: FeatureRoute::Inline,
            })?;
            features[i] = Some(report.features.to_vec());
        }
        let feats = features[i].as_deref().unwrap_or_default();
        let frac = step as f32 / plan.steps.max(1) as f32;
        let metrics = trainer.train_step_features(
            train_batch(batch, LR * (1.0 - 0.9 * frac)),
            FeatureBatch {
                width,
                layers: RVec::from(layers.clone()),
                sources: RVec::from(vec![FeatureSource {
                    route: FeatureRoute::Inline,
                    rows: (feats.len() / width as usize) as u64,
                    features: RVec::from(feats.to_vec()),
                }]),
            },
        )?;
        let accs: Vec<f64> = (0..TTT_STEPS)
            .map(|k| metric(&metrics, &format!("acc_{k}")))
            .collect();
        if step >= last_epoch {
            acc.push(accs.clone());
        }
        if step % 50 == 0 || step + 1 == plan.steps {
            eprintln!(
                "spec: {name}: drafter step {:>4}/{}: loss {:.3}, acc {}",
                step + 1,
                plan.steps,
                metric(&metrics, "loss"),
                fmt_acc(&accs)
            );
        }
    }
    let n = acc.len().max(1) as f64;
    let acc: Vec<f64> = (0..TTT_STEPS)
        .map(|k| acc.iter().map(|a| a[k]).sum::<f64>() / n)
        .collect();
    eprintln!(
        "spec: {name}: final training accuracy per draft position (mean of the last {} steps): \
         {}",
        n,
        fmt_acc(&acc)
    );
    let dir = ctx.scratch.join(format!("{name}-drafter"));
    trainer.save_checkpoint(&dir.display().to_string())?;
    Ok(Drafted { dir, acc })
}

fn fmt_acc(acc: &[f64]) -> String {
    acc.iter()
        .map(|a| format!("{a:.3}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The trainer's batch: the sequences with their prompt lengths (SFT-shaped; the drafter
/// reads only the tokens, prompt lengths, learning rate and clip).
pub(super) fn train_batch_of(tokens: impl Iterator<Item = (Vec<u32>, u32)>, lr: f32) -> TrainBatch {
    TrainBatch {
        sequences: tokens
            .map(|(t, prompt_len)| TrainSequence {
                tokens: RVec::from(t),
                prompt_len,
                advantage: 0.0,
                old_logprobs: RVec::new(),
                ref_logprobs: RVec::new(),
            })
            .collect(),
        loss: LossConfig {
            kind: LossKind::Sft,
            clip_eps_low: 0.0,
            clip_eps_high: 0.0,
            kl_coef: 0.0,
            learning_rate: lr,
            grad_clip: 1.0,
        },
    }
}

fn train_batch(batch: &[Seq], lr: f32) -> TrainBatch {
    train_batch_of(batch.iter().map(|s| (s.tokens.clone(), s.prompt_len)), lr)
}
