//! Model preparation: create a preset model when the job's model directory is absent, and
//! warm-start it with supervised steps on the job's task (`tandem model sft` does the same by
//! hand), so GRPO starts from a policy that sometimes answers right.
//!
//! The trainer runs in this process through the plugin registry like any trainer, on heap
//! buffers (no memory services are needed for a one-off job). The result is written to a
//! temporary directory next to the target and renamed into place, so an interrupted warm
//! start never leaves a half-written model behind.

use super::prompt::PromptCodec;
use crate::config::EnvironmentSection;
use crate::env::{Env, ToScore};
use crate::error::RlError;
use std::path::{Path, PathBuf};
use tandem_plugin_api::{
    ComponentConfig, ComponentKind, LossConfig, LossKind, PResult, RVec, SamplingParams,
    TrainBatch, TrainSequence, TrainerBox, TrainerInfo,
};
use tandem_runtime::registry::Registry;
use tandem_runtime::services::Services;

/// The component whose trainer creates preset models (its `init_preset` and `init_seed`
/// options): the native plugin's. The host knows presets only by name.
pub const MODEL_TOOL: &str = "native";

/// Settings of a supervised warm start.
#[derive(Debug, Clone)]
pub struct SftOptions {
    /// Optimiser steps.
    pub steps: u32,
    /// Problems per step.
    pub batch: u32,
    /// Learning rate.
    pub learning_rate: f32,
    /// Seed of the problem stream (kept apart from the RL stream).
    pub seed: u64,
    /// How prompts are rendered (`chat`, `system`, `tools`); `None`: plain text. With tools
    /// each problem is a tool-use conversation (see [`sft`]).
    pub prompts: Option<EnvironmentSection>,
    /// Held-out problems the greedy accuracy is measured on afterwards.
    pub eval_problems: u32,
}

impl Default for SftOptions {
    fn default() -> Self {
        SftOptions {
            steps: 100,
            batch: 32,
            learning_rate: 2e-3,
            seed: 0x5f7_u64,
            prompts: None,
            eval_problems: 64,
        }
    }
}

/// What a warm start did.
#[derive(Debug, Clone)]
pub struct SftReport {
    /// Loss of the first step.
    pub first_loss: f64,
    /// Loss of the last step.
    pub last_loss: f64,
    /// Greedy exact-match accuracy on held-out problems afterwards.
    pub accuracy: f64,
}

fn call<T>(r: PResult<T>, what: &str) -> Result<T, RlError> {
    r.into_result().map_err(|e| RlError::plugin(what, e))
}

/// A sibling path of `target` for staging (`.<name>.tmp-<pid>`).
fn staging_dir(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    target.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// The job's model as validation resolved it: where it goes, the preset that creates it and
/// the supervised steps that warm it up on the job's task (`[model]`, `[run] seed`).
#[derive(Debug, Clone, Copy)]
pub struct ModelPlan<'a> {
    /// The model directory.
    pub target: &'a Path,
    /// `init_preset`, when the directory is to be created.
    pub preset: Option<&'a str>,
    /// `warm_start_steps`.
    pub warm_start_steps: u32,
    /// The run's seed.
    pub seed: u64,
}

/// Creates `model.target` from its preset (and warm-starts it on `task`) unless it already
/// exists. Returns `true` when it created the model.
pub fn ensure_model(
    registry: &Registry,
    model: &ModelPlan<'_>,
    env: &Env,
) -> Result<bool, RlError> {
    let ModelPlan {
        target,
        preset,
        warm_start_steps,
        seed,
    } = *model;
    if target.join("config.json").is_file() {
        return Ok(false);
    }
    let Some(preset) = preset else {
        return Err(RlError::usage(format!(
            "model directory {} has no config.json",
            target.display()
        ))
        .with_help(
            "point [model] path at a Hugging Face model directory, or set init_preset = \"tiny\" \
             to create one",
        ));
    };
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(RlError::io(format!("creating {}", parent.display())))?;
    }
    let init_dir = staging_dir(target).with_extension("init");
    let _ = std::fs::remove_dir_all(&init_dir);
    eprintln!("creating a {preset} model in {} ...", target.display());
    create_preset(registry, &init_dir, preset, seed)
        .map_err(|e| RlError::failed(format!("[model] init_preset = \"{preset}\": {e}")))?;
    let result = if warm_start_steps > 0 {
        let opts = SftOptions {
            steps: warm_start_steps,
            seed: seed ^ SftOptions::default().seed,
            ..SftOptions::default()
        };
        sft(registry, &init_dir, target, env, &opts).map(|r| {
            eprintln!(
                "warm start: {} steps, loss {:.3} -> {:.3}, greedy accuracy {:.0}%",
                warm_start_steps,
                r.first_loss,
                r.last_loss,
                r.accuracy * 100.0
            );
        })
    } else {
        std::fs::rename(&init_dir, target).map_err(RlError::io(format!(
            "moving the new model into {}",
            target.display()
        )))
    };
    let _ = std::fs::remove_dir_all(&init_dir);
    result.map(|()| true)
}

/// A single-rank CPU configuration of `component` on the model at `model`, no run directory.
pub(crate) fn cpu_config(
    component: &str,
    model: &Path,
    options: &serde_json::Value,
) -> ComponentConfig {
    ComponentConfig {
        component: component.into(),
        model_path: model.display().to_string().into(),
        options_json: options.to_string().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    }
}

/// Writes the preset model `preset` into `dir` (absent or empty) through [`MODEL_TOOL`]'s
/// trainer, and returns what the trainer reports of it.
pub fn create_preset(
    registry: &Registry,
    dir: &Path,
    preset: &str,
    seed: u64,
) -> Result<TrainerInfo, RlError> {
    let options = serde_json::json!({"init_preset": preset, "init_seed": seed});
    let config = cpu_config(MODEL_TOOL, dir, &options);
    let problems = registry.validate_config(ComponentKind::Trainer, config.clone())?;
    if let Some(p) = problems.into_iter().flatten().next() {
        let e = RlError::usage(format!("preset `{preset}`: {}", p.message));
        return Err(if p.help.is_empty() {
            e
        } else {
            e.with_help(p.help.as_str())
        });
    }
    let services = Services::new();
    let mut trainer: TrainerBox = registry.new_trainer(config, services.handle())?;
    call(trainer.init(), "creating the model: init")
}

/// Supervised fine-tuning of the model in `model` on `task`, written to `out` (which must not
/// exist yet; written atomically). With tools (`opts.prompts`) a problem trains as the
/// conversation a tool user has: a calculator call of the problem's `expression` (item
/// metadata), the calculator's answer (never trained), then `The answer is N.`; each
/// assistant turn one sequence, as multi-turn rollouts train (`crate::turns`).
pub fn sft(
    registry: &Registry,
    model: &Path,
    out: &Path,
    env: &Env,
    opts: &SftOptions,
) -> Result<SftReport, RlError> {
    if out.exists() {
        return Err(
            RlError::usage(format!("refusing to overwrite {}", out.display()))
                .with_help("choose a new --out"),
        );
    }
    let codec = match &opts.prompts {
        Some(section) => PromptCodec::for_env(model, section)?,
        None => PromptCodec::load(model)?,
    };
    let stage = staging_dir(out);
    let _ = std::fs::remove_dir_all(&stage);
    let services = Services::new();
    let mut config = cpu_config("native", model, &serde_json::json!({}));
    config.run_dir = stage.display().to_string().into();
    let mut trainer: TrainerBox = registry.new_trainer(config, services.handle())?;
    call(trainer.init(), "sft: init")?;
    let loss = LossConfig {
        kind: LossKind::Sft,
        clip_eps_low: 0.2,
        clip_eps_high: 0.2,
        kl_coef: 0.0,
        learning_rate: opts.learning_rate,
        grad_clip: 1.0,
    };
    let (mut first, mut last) = (f64::NAN, f64::NAN);
    for step in 0..opts.steps {
        let first_problem = u64::from(step) * u64::from(opts.batch);
        let batch = TrainBatch {
            sequences: RVec::from(sft_sequences(env, &codec, first_problem, opts.batch)?),
            loss: loss.clone(),
        };
        let metrics = call(trainer.train_step(batch), "sft: train_step")?;
        let l = metrics
            .iter()
            .find(|m| m.name.as_str() == "loss")
            .map(|m| m.value)
            .unwrap_or(f64::NAN);
        if step == 0 {
            first = l;
        }
        last = l;
        if step % 25 == 0 || step + 1 == opts.steps {
            eprintln!("  sft step {:>4}/{}  loss {l:.4}", step + 1, opts.steps);
        }
    }
    call(
        trainer.save_checkpoint(stage.display().to_string().into()),
        "sft: save_checkpoint",
    )?;
    // The model is its weights: the checkpoint's AdamW moments (twice the weights' size)
    // have no use in it.
    let _ = std::fs::remove_file(stage.join("optimizer.safetensors"));
    // Tokenizer, generation config and chat template of the model it started from.
    tandem_model::companion::complete(model, &stage)?;
    drop(trainer);
    let n = u64::from(opts.eval_problems.max(1));
    let accuracy = greedy_accuracy(registry, &stage, env, &codec, n)?;
    std::fs::rename(&stage, out).map_err(RlError::io(format!(
        "moving the model into {}",
        out.display()
    )))?;
    Ok(SftReport {
        first_loss: first,
        last_loss: last,
        accuracy,
    })
}

/// Supervised sequences (prompt + target) of `count` problems from `first` on.
fn sft_sequences(
    env: &Env,
    codec: &PromptCodec,
    first: u64,
    count: u32,
) -> Result<Vec<TrainSequence>, RlError> {
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..u64::from(count) {
        let p = env.problem(first + i)?;
        let prompt = codec.prompt_of(&p)?;
        let Some(tools) = codec.tools() else {
            out.push(sequence(prompt, codec.completion(&p.target())?));
            continue;
        };
        let expression = serde_json::from_str::<serde_json::Value>(&p.item.metadata_json)
            .ok()
            .and_then(|m| m.get("expression")?.as_str().map(str::to_owned))
            .ok_or_else(|| {
                RlError::usage(format!(
                    "item `{}` has no `expression` in its metadata for a tool-use warm start",
                    p.id()
                ))
                .with_help("use a task that gives one (arithmetic, word_problems), or no tools")
            })?;
        let args = serde_json::json!({ "expression": expression });
        let call = tools.call_text("calculate", &args);
        let answer = tandem_model::tools::run_builtin("calculate", &args);
        let between = codec.between_turns(
            &call,
            codec.stop_ids().first().copied(),
            &[tools.family().result_message(&answer)],
        )?;
        let call_ids = codec.completion(&call)?;
        let mut context = prompt.clone();
        context.extend(&call_ids);
        context.extend(between);
        out.push(sequence(prompt, call_ids));
        out.push(sequence(
            context,
            codec.completion(&format!("The answer is {}.", p.answer()))?,
        ));
    }
    Ok(out)
}

/// An SFT sequence: `prompt`, then `target` (the trained tokens).
fn sequence(prompt: Vec<u32>, target: Vec<u32>) -> TrainSequence {
    let prompt_len = prompt.len() as u32;
    let mut tokens = prompt;
    tokens.extend(target);
    TrainSequence {
        prompt_len,
        tokens: RVec::from(tokens),
        advantage: 0.0,
        old_logprobs: RVec::new(),
        ref_logprobs: RVec::new(),
    }
}

/// Exact-match rate of greedy answers on `n` problems from the end of the task's stream.
pub fn greedy_accuracy(
    registry: &Registry,
    model: &Path,
    env: &Env,
    codec: &PromptCodec,
    n: u64,
) -> Result<f64, RlError> {
    let services = Services::new();
    let max_seq_len = if codec.tools().is_some() { 1024 } else { 128 };
    let options = serde_json::json!({"max_batch": n, "max_seq_len": max_seq_len});
    let config = cpu_config("native", model, &options);
    let engine = registry.new_engine(config, services.handle())?;
    let problems: Vec<_> = (0..n)
        .map(|i| env.problem(u64::MAX - i))
        .collect::<Result<_, _>>()?;
    let prompts = problems
        .iter()
        .map(|p| codec.prompt_of(p).map(RVec::from))
        .collect::<Result<Vec<_>, _>>()?;
    let request = tandem_plugin_api::GenerateRequest {
        prompts: RVec::from(prompts),
        sampling: SamplingParams {
            temperature: 0.0,
            max_tokens: 8,
            stop_token_ids: RVec::from(codec.stop_ids().to_vec()),
            logprobs: false,
            ..SamplingParams::default()
        },
        adapter: tandem_plugin_api::ROption::RNone,
    };
    if let Some(tools) = codec.tools() {
        // Tool use: the conversation's turns, the last one scored by the environment.
        let request = tandem_plugin_api::GenerateRequest {
            sampling: SamplingParams {
                max_tokens: 48,
                ..request.sampling
            },
            ..request
        };
        let trajectories = tools.run(request, codec, &mut |r| {
            call(engine.generate(r), "sft: evaluation generate")
        })?;
        let texts = trajectories
            .iter()
            .map(|t| codec.decode(t.last().map_or(&[][..], |c| &c.tokens[..])))
            .collect::<Result<Vec<_>, _>>()?;
        let batch: Vec<ToScore<'_>> = problems
            .iter()
            .zip(&texts)
            .map(|(p, text)| ToScore {
                problem: p,
                text: text.clone(),
                token_ids: Vec::new(),
                finished: true,
            })
            .collect();
        let top = env.info().reward_max;
        let right = (env.score(&batch).rewards.iter())
            .filter(|r| r.status == tandem_plugin_api::RewardStatus::Ok && r.value >= top)
            .count();
        return Ok(right as f64 / n as f64);
    }
    let response = call(engine.generate(request), "sft: evaluation generate")?;
    let mut right = 0u64;
    for (p, c) in problems.iter().zip(response.completions.iter()) {
        let text = codec.decode(&c.tokens)?;
        // The answer exactly (the warm start's own measure, whatever the environment's
        // reward).
        if text.trim() == p.answer() {
            right += 1;
        }
    }
    Ok(right as f64 / n as f64)
}

#[cfg(test)]
#[path = "warmstart_tests.rs"]
mod tests;
