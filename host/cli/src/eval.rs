//! `tandem eval MODEL_DIR`: greedy accuracy of a model on the held-out split of an
//! environment — the
//! set and the prompts a run's `[eval]` uses ([`tandem_rl::eval`]), answered by the `native`
//! engine constructed through the plugin registry (as `tandem generate` does).
//!
//! With `--job JOB.toml` the environment, `chat`/`system`, seed, held-out size and answer length
//! come from the job file, and so do the engine's options (its `native` `[engine.options]`)
//! and ranks: rank `r`'s share is asked as one request, exactly as the run asks its engine
//! rank `r`, so the same weights give the same answers and the run's `eval_accuracy` is
//! reproduced. A run's checkpoint (`checkpoints/step-N`) holds weights and config only; its
//! tokenizer (and chat template) then come from the job's `[model] path`, and a LoRA run's
//! checkpoint (a PEFT adapter) is applied to that model as the run's engines applied it.
//! Without `--job`: `--environment`, `--options`, `--chat`, `--system`, one engine rank
//! (relative paths in the options resolve against the working directory).

use crate::error::CliError;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use tandem_plugin_api::{ComponentConfig, EngineBox, GenerateResponse, RString};
use tandem_rl::config::{AlgorithmSection, EnvironmentSection, EvalSection, LoadedJob};
use tandem_rl::env::{Env, EnvSpec};
use tandem_rl::eval::{Answer, EvalResult, EvalSet};
use tandem_rl::prompt::PromptCodec;
use tandem_runtime::services::Services;

/// Arguments of `tandem eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Model directory (Hugging Face layout, or a run's `checkpoints/step-N` with --job).
    model: PathBuf,
    /// Take the environment, chat settings, seed, held-out size, answer length and engine options
    /// from this job file (as its run's `[eval]` does).
    #[arg(long, value_name = "JOB.toml")]
    job: Option<PathBuf>,
    /// The environment (`tandem plugins` lists them; default `arithmetic`).
    #[arg(long, alias = "task", conflicts_with = "job", value_name = "NAME")]
    environment: Option<String>,
    /// Its options as TOML, e.g. `--options 'digits = 3'` (as `[environment.options]`).
    #[arg(
        long,
        alias = "task-options",
        conflicts_with = "job",
        value_name = "TOML"
    )]
    options: Option<String>,
    /// Render prompts through the model's chat template.
    #[arg(long, conflicts_with = "job")]
    chat: bool,
    /// System message of chat prompts.
    #[arg(long, conflicts_with = "job", requires = "chat")]
    system: Option<String>,
    /// Size of the held-out set (default: the job's `[eval] problems`, else 64).
    #[arg(long, value_name = "K")]
    problems: Option<u32>,
    /// Max new tokens per answer (default: the job's, else 8).
    #[arg(long, value_name = "N")]
    max_tokens: Option<u32>,
    /// Seed of the held-out set (default: the job's `[run] seed`, else 0).
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Also print the first N problems with the model's answers.
    #[arg(long, value_name = "N", default_value_t = 0)]
    show: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// What is evaluated and how, from a job file or the arguments.
struct Settings {
    env: EnvironmentSection,
    /// Where relative paths in the environment's options resolve.
    base_dir: PathBuf,
    seed: u64,
    problems: u32,
    max_tokens: u32,
    /// Engine ranks the set is split over (the job's).
    ranks: u32,
    /// The `native` engine's options (the job's, when its engine is `native`).
    engine_options: Option<serde_json::Value>,
    /// Where the tokenizer comes from when the model directory has none.
    job_model: Option<PathBuf>,
    job_dirs: Vec<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Output {
    accuracy: f64,
    correct: u32,
    problems: u32,
    /// Answers whose reward failed (counted as wrong).
    failed: u32,
    /// Accuracy per data source, when the items have sources.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    by_source: std::collections::BTreeMap<String, f64>,
    environment: String,
    chat: bool,
    seed: u64,
    max_tokens: u32,
    model: PathBuf,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    shown: Vec<Answer>,
}

fn settings(args: &EvalArgs) -> Result<Settings, CliError> {
    let mut s = match &args.job {
        Some(path) => from_job(path)?,
        None => {
            let options: serde_json::Map<String, serde_json::Value> =
                toml::from_str(args.options.as_deref().unwrap_or("")).map_err(|e| {
                    CliError::usage(format!("--options: {}", one_line(&e.to_string())))
                        .with_help("give TOML key = value pairs, e.g. --options 'digits = 3'")
                })?;
            Settings {
                env: EnvironmentSection {
                    plugin: args
                        .environment
                        .clone()
                        .unwrap_or_else(|| "arithmetic".into()),
                    chat: args.chat,
                    system: args.system.clone(),
                    options,
                    ..EnvironmentSection::default()
                },
                base_dir: PathBuf::from("."),
                seed: 0,
                problems: EvalSection::default().problems,
                max_tokens: AlgorithmSection::default().max_tokens,
                ranks: 1,
                engine_options: None,
                job_model: None,
                job_dirs: Vec::new(),
            }
        }
    };
    s.seed = args.seed.unwrap_or(s.seed);
    s.problems = args.problems.unwrap_or(s.problems);
    s.max_tokens = args.max_tokens.unwrap_or(s.max_tokens);
    if s.problems == 0 {
        return Err(CliError::usage(
            "--problems 0: the held-out set needs at least 1 problem",
        ));
    }
    if s.max_tokens == 0 {
        return Err(CliError::usage(
            "--max-tokens 0: answers need at least 1 new token",
        ));
    }
    Ok(s)
}

fn from_job(path: &Path) -> Result<Settings, CliError> {
    let job = LoadedJob::read(path)?;
    let job_dirs = super::check::job_dirs(&job);
    let registry = super::load_registry(&[], &job_dirs)?;
    tandem_rl::config::validate_task_and_eval(&job, &registry)?;
    let j = &job.job;
    let engine_options = (j.engine.plugin.get_ref() == "native")
        .then(|| tandem_rl::config::options_json(&j.engine.options))
        .transpose()
        .map_err(|e| CliError::usage(format!("{}: [engine.options]: {e}", path.display())))?
        .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::Null));
    Ok(Settings {
        env: j.environment().clone(),
        base_dir: job.resolve_path(Path::new(".")),
        seed: j.run.seed,
        problems: j.eval.problems,
        max_tokens: j.eval.max_tokens.unwrap_or(j.algorithm.max_tokens),
        ranks: j.engine.ranks.max(1),
        engine_options,
        job_model: Some(job.resolve_path(&j.model.path)),
        job_dirs,
    })
}

/// The directory whose tokenizer (and chat template) encodes the prompts: the model's own,
/// else the job's model (a LoRA checkpoint is an adapter: its base holds `config.json`; a
/// checkpoint of an older run may have weights and config only).
fn text_dir(model: &Path, s: &Settings) -> Result<PathBuf, CliError> {
    if model.join("tokenizer.json").is_file() && model.join("config.json").is_file() {
        return Ok(model.to_path_buf());
    }
    match &s.job_model {
        Some(m) if m.join("tokenizer.json").is_file() => Ok(m.clone()),
        _ => Err(
            CliError::usage(format!("{} has no tokenizer.json", model.display())).with_help(
                "for a run's checkpoint pass --job JOB.toml (its [model] path has the tokenizer), \
             or copy the model's tokenizer files into the directory",
            ),
        ),
    }
}

pub(super) fn run(cli_dirs: &[PathBuf], args: EvalArgs) -> Result<(), CliError> {
    let dir = &args.model;
    if !dir.is_dir() {
        return Err(
            CliError::usage(format!("model directory {} does not exist", dir.display()))
                .with_help("give a Hugging Face model directory or a run's checkpoints/step-N"),
        );
    }
    let s = settings(&args)?;
    let (weights, adapter) = weights(dir, &s)?;
    let what = format!("{}", dir.display());
    let codec = PromptCodec::for_env(&text_dir(dir, &s)?, &s.env)?;
    let registry = super::load_registry(cli_dirs, &s.job_dirs)?;
    let spec = EnvSpec {
        section: &s.env,
        seed: s.seed,
        held_out: s.problems,
        base_dir: &s.base_dir,
    };
    let env = Env::build(&registry, spec, Some(&std::env::temp_dir()))?;
    let set = EvalSet::new(env.held_out(s.problems)?, &codec, s.max_tokens)?;
    let problems = set.problems().len() as u32;
    let options = s.engine_options.clone().unwrap_or_else(|| {
        serde_json::json!({
            "max_batch": problems.min(64),
            "max_seq_len": set.longest_prompt()
                + tandem_rl::turns::after_prompt(&s.env, s.max_tokens) as usize
                + 1,
        })
    });
    let engine = construct(cli_dirs, &s.job_dirs, &weights, &options)?;
    if let Some(a) = &adapter {
        let path = RString::from(a.display().to_string());
        super::generate::call(engine.load_adapter(ADAPTER.into(), path), &what)?;
    }
    let adapter = adapter.map(|_| ADAPTER);
    let ranks = s.ranks as usize;
    let mut replies: Vec<Option<GenerateResponse>> = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        replies.push(match set.request(rank, ranks, adapter) {
            // With tools: each problem's turns, its last one the answer.
            Some(r) => Some(tandem_rl::turns::answers(r, &codec, &mut |r| {
                engine
                    .generate(r)
                    .into_result()
                    .map_err(|e| tandem_rl::error::RlError::plugin(format!("{what}: generate"), e))
            })?),
            None => None,
        });
    }
    let answers = set.answers(&env, &codec, &replies)?;
    let result = EvalResult::of(&answers);
    let out = Output {
        accuracy: result.accuracy(),
        correct: result.correct,
        problems: result.problems,
        failed: result.failed,
        by_source: result
            .by_source
            .iter()
            .map(|(k, (right, n))| (k.clone(), f64::from(*right) / f64::from((*n).max(1))))
            .collect(),
        environment: env.name().to_owned(),
        chat: s.env.chat,
        seed: s.seed,
        max_tokens: s.max_tokens,
        model: dir.clone(),
        shown: answers.into_iter().take(args.show).collect(),
    };
    if args.json {
        return super::print_json(&out);
    }
    for a in &out.shown {
        let mark = if a.right { "right" } else { "wrong" };
        println!(
            "{mark}: {:?} -> {:?} (answer {})",
            a.prompt, a.completion, a.answer
        );
    }
    println!(
        "accuracy {:.1}% ({}/{}) on the held-out set of {}",
        out.accuracy * 100.0,
        out.correct,
        out.problems,
        out.environment
    );
    for (source, accuracy) in &out.by_source {
        println!("  {source}: {:.1}%", accuracy * 100.0);
    }
    Ok(())
}

/// The name the adapter of a LoRA checkpoint is loaded under.
const ADAPTER: &str = "eval";

/// The weights to serve and the adapter to apply: a model directory as it is, or (with
/// `--job`) a LoRA run's checkpoint — a PEFT adapter — over the job's `[model] path`, as the
/// run's engines served it.
fn weights(dir: &Path, s: &Settings) -> Result<(PathBuf, Option<PathBuf>), CliError> {
    if dir.join("config.json").is_file() {
        return Ok((dir.to_path_buf(), None));
    }
    if dir.join("adapter_config.json").is_file() {
        return match &s.job_model {
            Some(m) if m.join("config.json").is_file() => Ok((m.clone(), Some(dir.to_path_buf()))),
            _ => Err(CliError::usage(format!(
                "{} is a LoRA adapter without its base model",
                dir.display()
            ))
            .with_help("pass --job JOB.toml: the adapter is applied to its [model] path")),
        };
    }
    Err(CliError::usage(format!(
        "model directory {} has no config.json",
        dir.display()
    ))
    .with_help("give a Hugging Face model directory or a run's checkpoints/step-N"))
}

fn construct(
    cli_dirs: &[PathBuf],
    job_dirs: &[PathBuf],
    dir: &Path,
    options: &serde_json::Value,
) -> Result<EngineBox, CliError> {
    let registry = super::load_registry(cli_dirs, job_dirs)?;
    let config = ComponentConfig {
        component: "native".into(),
        model_path: dir.display().to_string().into(),
        options_json: options.to_string().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: RString::new(),
    };
    // No memory services in the CLI process: the engine computes on heap buffers.
    let services = Services::new();
    registry
        .new_engine(config, services.handle())
        .map_err(|e| super::generate::user_error(e.into()))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
