//! `tandem generate`: one-shot generation with the `native` engine, constructed through the
//! plugin registry like any engine (`Registry::new_engine` with the model directory as
//! `model_path`). Prints tokens, text (the model's `tokenizer.json`) and per-token logprobs;
//! `--score` adds the logprob of every token of prompt + completion; `--drafter DIR` decodes
//! speculatively with an EAGLE-3 drafter (same tokens under greedy decoding) and reports the
//! mean acceptance length.

use crate::error::CliError;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use tandem_plugin_api::{
    ComponentConfig, EngineBox, ErrorCode, FinishReason, GenerateRequest, PResult, ROption,
    RString, RVec, SamplingParams,
};
use tandem_runtime::RuntimeError;
use tandem_runtime::services::Services;
use tokenizers::Tokenizer;

/// Arguments of `tandem generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model directory (Hugging Face layout: config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (encoded with the model's tokenizer.json).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_name = "IDS")]
    prompt_ids: Option<String>,
    /// Maximum new tokens.
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// Greedy decoding (the default unless --temperature is given).
    #[arg(long, conflicts_with = "temperature")]
    greedy: bool,
    /// Sampling temperature.
    #[arg(long)]
    temperature: Option<f32>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// PEFT LoRA adapter directory to generate with.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// Decode speculatively with this drafter directory (e.g. a `native-drafter` checkpoint).
    #[arg(long, value_name = "DIR")]
    pub drafter: Option<PathBuf>,
    /// Draft tokens per speculative round (with --drafter).
    #[arg(long, default_value_t = 4, requires = "drafter")]
    pub draft_tokens: u32,
    /// Also print the logprob of every token of prompt + completion.
    #[arg(long)]
    score: bool,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Output {
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    text: Option<String>,
    logprobs: Vec<f32>,
    finish_reason: &'static str,
    weight_version: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    score: Option<Vec<f32>>,
    /// Tokens emitted per verification round (with --drafter).
    #[serde(skip_serializing_if = "Option::is_none")]
    acceptance_length: Option<f64>,
}

/// Plugin errors about the user's files or arguments are usage errors (exit 2).
pub(crate) fn user_error(e: CliError) -> CliError {
    match e {
        CliError::Runtime(RuntimeError::Plugin { context, source })
            if matches!(
                source.code,
                ErrorCode::InvalidInput | ErrorCode::Io | ErrorCode::Corrupt
            ) =>
        {
            CliError::usage(format!("{context}: {source}"))
        }
        other => other,
    }
}

pub(crate) fn call<T>(r: PResult<T>, what: &str) -> Result<T, CliError> {
    r.into_result()
        .map_err(|e| user_error(CliError::plugin(what, e)))
}

fn parse_ids(s: &str) -> Result<Vec<u32>, CliError> {
    s.split(',')
        .map(|x| {
            x.trim().parse::<u32>().map_err(|_| {
                CliError::usage(format!(
                    "--prompt-ids: `{x}` is not a token id; give comma-separated integers like 1,2,3"
                ))
            })
        })
        .collect()
}

pub(super) fn run(cli_dirs: &[PathBuf], args: GenerateArgs) -> Result<(), CliError> {
    let dir = &args.model;
    let (_, eos) = tandem_model::tokens::special_ids(dir)
        .map_err(|e| CliError::usage(format!("--model {}: {e}", dir.display())))?;
    let tk = Tokenizer::from_file(dir.join("tokenizer.json")).ok();
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => parse_ids(ids)?,
        (Some(text), None) => {
            let tk = tk.as_ref().ok_or_else(|| {
                CliError::usage(format!(
                    "--prompt needs {}/tokenizer.json; give --prompt-ids instead",
                    dir.display()
                ))
            })?;
            tk.encode(text.as_str(), false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| CliError::usage(format!("--prompt: {e}")))?
        }
        (None, None) => return Err(CliError::usage("give --prompt or --prompt-ids")),
    };
    if prompt.is_empty() {
        return Err(CliError::usage("the prompt encodes to no tokens"));
    }
    if args.draft_tokens == 0 {
        return Err(CliError::usage(
            "--draft-tokens 0: the drafter proposes at least one token per round; e.g. 4",
        ));
    }
    let engine = construct(
        cli_dirs,
        dir,
        prompt.len() + args.max_tokens as usize + 1,
        args.draft_tokens,
    )?;
    if let Some(d) = &args.drafter {
        let what = format!("--drafter {}", d.display());
        call(engine.load_drafter(d.display().to_string().into()), &what)?;
    }
    let adapter = match &args.adapter {
        Some(a) => {
            let what = format!("--adapter {}", a.display());
            call(
                engine.load_adapter("cli".into(), a.display().to_string().into()),
                &what,
            )?;
            ROption::RSome(RString::from("cli"))
        }
        None => ROption::RNone,
    };
    let sampling = SamplingParams {
        temperature: if args.greedy {
            0.0
        } else {
            args.temperature.unwrap_or(0.0)
        },
        max_tokens: args.max_tokens,
        stop_token_ids: eos.iter().copied().collect(),
        seed: ROption::RSome(args.seed),
        logprobs: true,
        ..SamplingParams::default()
    };
    let request = GenerateRequest {
        prompts: RVec::from(vec![RVec::from(prompt.clone())]),
        sampling,
        adapter,
    };
    let response = call(engine.generate(request), "generate")?;
    let c = response
        .completions
        .first()
        .ok_or_else(|| CliError::failed("the engine returned no completion"))?;
    let tokens = c.tokens.to_vec();
    let score = if args.score {
        if args.adapter.is_some() {
            return Err(CliError::usage(
                "--score scores under the base weights; drop --adapter to use it",
            ));
        }
        let full: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
        let s = call(engine.score(RVec::from(vec![RVec::from(full)])), "score")?;
        s.first().map(|v| v.to_vec())
    } else {
        None
    };
    let acceptance_length = match &args.drafter {
        Some(_) => {
            let stats = call(engine.stats(), "stats")?;
            let get = |n: &str| {
                stats
                    .metrics
                    .iter()
                    .find(|m| m.name.as_str() == n)
                    .map_or(0.0, |m| m.value)
            };
            let rounds = get("spec.rounds");
            (rounds > 0.0).then(|| get("spec.emitted") / rounds)
        }
        None => None,
    };
    let out = Output {
        acceptance_length,
        text: tk.as_ref().and_then(|tk| tk.decode(&tokens, true).ok()),
        prompt_ids: prompt,
        logprobs: c.logprobs.to_vec(),
        finish_reason: match c.finish_reason {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::Aborted => "aborted",
        },
        weight_version: response.weight_version,
        score,
        tokens,
    };
    print(&out, args.json)
}

fn construct(
    cli_dirs: &[PathBuf],
    dir: &Path,
    max_seq: usize,
    draft_tokens: u32,
) -> Result<EngineBox, CliError> {
    let registry = super::load_registry(cli_dirs, &[])?;
    let config = ComponentConfig {
        component: "native".into(),
        model_path: dir.display().to_string().into(),
        options_json: serde_json::json!({
            "max_batch": 1,
            "max_seq_len": max_seq,
            "draft_tokens": draft_tokens,
        })
        .to_string()
        .into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: RString::new(),
    };
    // No memory services in the CLI process: the engine computes on heap buffers.
    let services = Services::new();
    registry
        .new_engine(config, services.handle())
        .map_err(|e| user_error(e.into()))
}

fn print(out: &Output, json: bool) -> Result<(), CliError> {
    if json {
        return super::print_json(out);
    }
    let join = |v: &[f32]| {
        v.iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let ids: Vec<String> = out.tokens.iter().map(u32::to_string).collect();
    println!("tokens:   {}", ids.join(" "));
    if let Some(t) = &out.text {
        println!("text:     {t:?}");
    }
    println!("logprobs: {}", join(&out.logprobs));
    println!("finish:   {}", out.finish_reason);
    if let Some(s) = &out.score {
        println!("score (tokens 2.. of prompt+completion): {}", join(s));
    }
    if let Some(a) = out.acceptance_length {
        println!("accepted: {a:.2} tokens per verification (speculative decoding)");
    }
    Ok(())
}
