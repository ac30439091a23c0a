//! `tandem plugins [--json]`: every plugin with kind, version, API level, source and
//! capabilities.

use crate::error::CliError;
use serde::Serialize;
use std::path::PathBuf;
use tandem_runtime::registry::LoadedPlugin;

/// Serializable view of one plugin.
#[derive(Debug, Serialize)]
pub struct PluginView {
    name: String,
    version: String,
    api_level: u32,
    abi_version: String,
    source: String,
    components: Vec<ComponentView>,
    /// Environment components (API level 6).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    environments: Vec<EnvironmentView>,
}

#[derive(Debug, Serialize)]
struct EnvironmentView {
    name: String,
    description: String,
}

#[derive(Debug, Serialize)]
struct ComponentView {
    kind: &'static str,
    name: String,
    description: String,
    update_kinds: Vec<&'static str>,
    releasable_tags: Vec<String>,
    pause_modes: Vec<&'static str>,
    hidden_states: bool,
    lora: bool,
    needs_gpu: Vec<String>,
    notes: Vec<String>,
}

impl PluginView {
    /// The view of a loaded plugin.
    pub fn of(p: &LoadedPlugin) -> Self {
        let m = &p.manifest;
        PluginView {
            name: m.name.to_string(),
            version: m.version.to_string(),
            api_level: m.api_level,
            abi_version: m.abi_version.to_string(),
            source: p.source.to_string(),
            components: m
                .components
                .iter()
                .map(|c| ComponentView {
                    kind: c.kind.as_str(),
                    name: c.name.to_string(),
                    description: c.description.to_string(),
                    update_kinds: c.caps.update_kinds.iter().map(|k| k.as_str()).collect(),
                    releasable_tags: c
                        .caps
                        .releasable_tags
                        .iter()
                        .map(|t| t.to_string())
                        .collect(),
                    pause_modes: c.caps.pause_modes.iter().map(|m| m.as_str()).collect(),
                    hidden_states: c.caps.hidden_states,
                    lora: c.caps.lora,
                    needs_gpu: c.caps.needs_gpu.iter().map(|t| t.to_string()).collect(),
                    notes: c.caps.notes.iter().map(|t| t.to_string()).collect(),
                })
                .collect(),
            environments: p
                .environments
                .iter()
                .map(|e| EnvironmentView {
                    name: e.name.to_string(),
                    description: e.description.to_string(),
                })
                .collect(),
        }
    }
}

pub(super) fn run(cli_dirs: &[PathBuf], json: bool) -> Result<(), CliError> {
    let registry = super::load_registry(cli_dirs, &[])?;
    let views: Vec<PluginView> = registry.plugins().iter().map(PluginView::of).collect();
    if json {
        for v in &views {
            super::print_json(v)?;
        }
        return Ok(());
    }
    if views.is_empty() {
        println!("no plugins found");
    }
    for v in &views {
        println!(
            "{} {} (API level {}, tandem-plugin-api {}) — {}",
            v.name, v.version, v.api_level, v.abi_version, v.source
        );
        for c in &v.components {
            println!("  {:<7} {:<12} {}", c.kind, c.name, c.description);
            let mut caps = Vec::new();
            if !c.update_kinds.is_empty() {
                caps.push(format!("updates: {}", c.update_kinds.join(", ")));
            }
            if !c.releasable_tags.is_empty() {
                caps.push(format!("releases: {}", c.releasable_tags.join(", ")));
            }
            if !c.pause_modes.is_empty() {
                caps.push(format!("pause: {}", c.pause_modes.join(", ")));
            }
            if c.lora {
                caps.push("lora".into());
            }
            if c.hidden_states {
                caps.push("hidden states".into());
            }
            if !caps.is_empty() {
                println!("          {}", caps.join("; "));
            }
            if !c.needs_gpu.is_empty() {
                println!("          needs a GPU: {}", c.needs_gpu.join(", "));
            }
            for n in &c.notes {
                println!("          note: {n}");
            }
        }
        for e in &v.environments {
            println!("  environment {:<14} {}", e.name, e.description);
        }
    }
    Ok(())
}
