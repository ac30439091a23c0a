//! `[task]`: the task is built the way the run builds it; its error names the key. A system
//! message needs `chat = true`; a chat task needs the model's chat template, and its first
//! prompt must render and encode the way the controller will.

use super::issues::Issues;
use crate::config::JobFile;
use crate::prompt::PromptCodec;
use std::path::Path;

/// Builds the job's task; a problem goes to its key (`task.kind`, `task.options.KEY`).
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile) {
    if j.task.system.is_some() && !j.task.chat {
        issues.at(
            "task.system",
            "a system message needs chat prompts",
            "set chat = true in [task], or remove system",
        );
    }
    let Err(e) = crate::task::build(&j.task, j.run.seed) else {
        return;
    };
    let help = e
        .help
        .unwrap_or_else(|| format!("built-in tasks: {}", crate::task::KINDS.join(", ")));
    issues.at(&format!("task.{}", e.key), e.message, help);
}

/// `chat = true`: the model at `model_path` (when it exists; `[model]` reports it otherwise)
/// has a chat template that renders the task's first prompt.
pub(super) fn check_chat(issues: &mut Issues<'_>, j: &JobFile, model_path: &Path) {
    if !j.task.chat {
        return;
    }
    if !model_path.join("config.json").is_file() {
        if let Some(preset) = &j.model.init_preset {
            issues.at(
                "task.chat",
                format!("the model is created from preset `{preset}`, which has no chat template"),
                "use chat = false with preset models, or point [model] path at a chat model",
            );
        }
        return;
    }
    if !model_path.join("tokenizer.json").is_file() {
        return;
    }
    let rendered = PromptCodec::for_task(model_path, &j.task).and_then(|codec| {
        let Ok(task) = crate::task::build(&j.task, j.run.seed) else {
            return Ok(());
        };
        codec.prompt(&task.problem(0).prompt).map(drop)
    });
    if let Err(e) = rendered {
        let help = e
            .help()
            .unwrap_or_else(|| "use chat = false to prompt with plain text".to_owned());
        issues.at("task.chat", e.to_string(), help);
    }
}
