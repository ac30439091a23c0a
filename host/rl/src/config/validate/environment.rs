//! `[environment]` (or `[task]`, its older name): the environment is built the way the run
//! builds it, with nothing started (`EnvironmentConfig::check_only`), so a missing file, a
//! bad column or an unknown option is one line here; its held-out split must exist when the
//! run evaluates. A system message needs `chat = true`; a chat environment needs the model's
//! chat template, and its first prompt must render and encode the way the controller will.

use super::issues::Issues;
use crate::config::EnvironmentSection;
use crate::config::{EnvPlan, JobFile, LoadedJob};
use crate::env::Env;
use crate::error::RlError;
use crate::prompt::PromptCodec;
use std::path::Path;
use tandem_model::tools::{BUILTIN_TOOLS, ToolFamily};
use tandem_plugin_api::HELD_OUT_SPLIT;
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;

/// The environment's plan: its section and the job file's directory.
pub(super) fn plan(job: &LoadedJob) -> EnvPlan {
    EnvPlan {
        section: job.job.environment().clone(),
        base_dir: crate::config::plan::absolute(&job.resolve_path(Path::new("."))),
    }
}

/// Held-out items the run builds its environment with: `[eval] problems` when the run
/// evaluates, a drafter job's `eval_prompts`, else none.
pub(super) fn held_out(j: &JobFile) -> u32 {
    if j.is_drafter_job() {
        j.drafter.eval_prompts
    } else if j.eval.enabled() {
        j.eval.problems
    } else {
        0
    }
}

/// The key that sets how many items are held out.
fn held_out_key(j: &JobFile) -> &'static str {
    if j.is_drafter_job() {
        "drafter.eval_prompts"
    } else {
        "eval.problems"
    }
}

/// Checks the section and builds the environment (started nothing); a problem goes to its
/// key. The environment when it builds.
pub(super) fn check(issues: &mut Issues<'_>, registry: &Registry, job: &LoadedJob) -> Option<Env> {
    let j = &job.job;
    let table = j.environment_table();
    let section = j.environment();
    if j.environment.is_some() && j.task.is_some() {
        issues.at(
            "task",
            "the job has both [environment] and [task]",
            "[task] is the older name of [environment]: keep one",
        );
    }
    if section.system.is_some() && !section.chat {
        issues.at(
            &format!("{table}.system"),
            "a system message needs chat prompts",
            format!("set chat = true in [{table}], or remove system"),
        );
    }
    if !(0.0..=1.0).contains(&section.max_failed_frac) {
        issues.at(
            &format!("{table}.max_failed_frac"),
            format!("{} is not a fraction", section.max_failed_frac),
            "use a value in 0..=1, e.g. 0.1 (a tenth of a step's samples may fail)",
        );
    }
    let plugin_key = if table == "task" {
        "task.kind"
    } else {
        "environment.plugin"
    };
    let env_plan = plan(job);
    let held = held_out(j);
    let env = match Env::build(registry, env_plan.spec(j.run.seed, held), None) {
        Ok(env) => env,
        Err(e) => {
            let help = e.help().unwrap_or_else(|| {
                format!(
                    "environments: {} (`tandem plugins` lists them)",
                    registry.environment_names().join(", ")
                )
            });
            // An environment's own error about an option (`options.KEY: ...`) goes to that
            // key, one about the held-out size (`held_out: ...`) to the key that sets it;
            // anything else to the component's name.
            let (key, message) = match &e {
                RlError::Runtime(RuntimeError::Plugin { source, .. }) => {
                    match source.message.split_once(": ") {
                        Some((k, rest)) if k.starts_with("options") && !k.contains(' ') => {
                            (format!("{table}.{k}"), rest.to_owned())
                        }
                        Some((HELD_OUT_SPLIT, rest)) => {
                            (held_out_key(j).to_owned(), rest.to_owned())
                        }
                        _ => (plugin_key.to_owned(), e.to_string()),
                    }
                }
                _ => (plugin_key.to_owned(), e.to_string()),
            };
            issues.at(&key, message, help);
            return None;
        }
    };
    if held > 0 && env.split_size(HELD_OUT_SPLIT).is_none() {
        issues.at(
            held_out_key(j),
            format!(
                "environment `{}` has no `{HELD_OUT_SPLIT}` split to evaluate on",
                env.name()
            ),
            "give the environment a held-out split (e.g. the dataset's held_out option), or do not evaluate",
        );
    }
    Some(env)
}

/// `chat = true`: the model at `model_path` (when it exists; `[model]` reports it otherwise)
/// has a chat template that renders the environment's first prompt.
pub(super) fn check_chat(
    issues: &mut Issues<'_>,
    j: &JobFile,
    model_path: &Path,
    env: Option<&Env>,
) {
    let table = j.environment_table();
    let section = j.environment();
    if !section.chat {
        return;
    }
    let key = format!("{table}.chat");
    if !model_path.join("config.json").is_file() {
        if let Some(preset) = &j.model.init_preset {
            issues.at(
                &key,
                format!("the model is created from preset `{preset}`, which has no chat template"),
                "use chat = false with preset models, or point [model] path at a chat model",
            );
        }
        return;
    }
    if !model_path.join("tokenizer.json").is_file() {
        return;
    }
    // The template first, without tools (their own problems are `tools::check`'s).
    let plain = EnvironmentSection {
        tools: Vec::new(),
        ..section.clone()
    };
    let rendered = PromptCodec::for_env(model_path, &plain).and_then(|codec| {
        // An environment that starts processes to answer (a Python class) has no item while
        // only checked: then only the template is checked.
        let Some(problem) = env.and_then(|e| e.problem(0).ok()) else {
            return Ok(());
        };
        codec.prompt_of(&problem).map(drop)
    });
    if let Err(e) = rendered {
        let help = e
            .help()
            .unwrap_or_else(|| "use chat = false to prompt with plain text".to_owned());
        issues.at(&key, e.to_string(), help);
        return;
    }
    // Then with them: the format the template teaches, append-only with a tool turn.
    let named_badly = section
        .tools
        .iter()
        .any(|t| !BUILTIN_TOOLS.contains(&t.as_str()))
        || (section.tool_format.as_deref()).is_some_and(|f| ToolFamily::from_name(f).is_err());
    if section.tools.is_empty() || named_badly {
        return;
    }
    if let Err(e) = PromptCodec::for_env(model_path, section) {
        let help = e
            .help()
            .unwrap_or_else(|| "name the format with tool_format, or remove tools".to_owned());
        issues.at(&format!("{table}.tools"), e.to_string(), help);
    }
}
