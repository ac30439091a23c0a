//! `[model]`: the directory the run loads (config and tokenizer, loaded the way the
//! controller loads them), or an absent or empty one `init_preset` creates — asked of the
//! trainer that creates presets.

use super::issues::Issues;
use crate::config::plan::absolute;
use std::path::Path;
use tandem_plugin_api::ComponentKind;
use tandem_runtime::registry::Registry;

/// The model directory must be usable by the run: a Hugging Face directory whose config and
/// tokenizer the controller loads, or absent (or empty) when `init_preset` creates it.
pub(super) fn check(
    issues: &mut Issues<'_>,
    registry: &Registry,
    model_path: &Path,
    preset: Option<&str>,
) {
    if model_path.join("config.json").is_file() {
        if !model_path.join("tokenizer.json").is_file() {
            issues.at(
                "model.path",
                format!(
                    "model directory {} has no tokenizer.json",
                    model_path.display()
                ),
                "the controller needs the model's tokenizer.json (Hugging Face layout)",
            );
            return;
        }
        // What the run loads on the controller before its first step.
        if let Err(e) = crate::prompt::PromptCodec::load(model_path) {
            let help = e
                .help()
                .unwrap_or_else(|| "point it at a Hugging Face model directory".to_owned());
            issues.at("model.path", e.to_string(), help);
        }
        return;
    }
    match preset {
        Some(preset) => {
            preset_check(issues, registry, model_path, preset);
            let occupied = if model_path.is_dir() {
                std::fs::read_dir(model_path).map_or(true, |mut d| d.next().is_some())
            } else {
                model_path.exists()
            };
            if occupied {
                issues.at(
                    "model.path",
                    format!(
                        "{} exists but holds no model (no config.json), so init_preset cannot create one there",
                        model_path.display()
                    ),
                    "point path at a new directory, or at a Hugging Face model directory",
                );
            }
        }
        None if !model_path.exists() => issues.at(
            "model.path",
            format!("model directory {} does not exist", model_path.display()),
            "point it at a Hugging Face model directory, or set init_preset = \"tiny\"",
        ),
        None => issues.at(
            "model.path",
            format!(
                "model directory {} has no config.json",
                model_path.display()
            ),
            "point it at a Hugging Face model directory, or set init_preset = \"tiny\" with a new path",
        ),
    }
}

/// Asks the model tool's trainer (`warmstart::MODEL_TOOL`) whether it can create `preset`.
fn preset_check(issues: &mut Issues<'_>, registry: &Registry, model_path: &Path, preset: &str) {
    let tool = crate::warmstart::MODEL_TOOL;
    let options = serde_json::json!({ "init_preset": preset });
    let config = crate::warmstart::cpu_config(tool, &absolute(model_path), &options);
    match registry.validate_config(ComponentKind::Trainer, config) {
        Ok(Some(problems)) => {
            for p in problems {
                issues.at(
                    "model.init_preset",
                    p.message.to_string(),
                    p.help.to_string(),
                );
            }
        }
        Ok(None) => {
            if registry.component(ComponentKind::Trainer, tool).is_none() {
                issues.at(
                    "model.init_preset",
                    format!(
                        "preset models are created by the `{tool}` trainer, which is not loaded"
                    ),
                    "point [model] path at a Hugging Face model directory",
                );
            }
        }
        Err(e) => issues.at(
            "model.init_preset",
            e.to_string(),
            "this is a bug in the plugin; report it",
        ),
    }
}
