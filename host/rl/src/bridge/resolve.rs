//! `[bridge] plugin` (or `mode`) and `[bridge.options]` resolved against the plugin registry
//! without side effects: what `tandem check` (config validation) and
//! [`BridgeDriver::new`](super::BridgeDriver::new) both run, so the driver never refuses a job
//! the check let through.

use crate::error::RlError;
use tandem_plugin_api::{
    BridgeBox, BridgePlan, ComponentConfig, ComponentKind, ResidentTags, UpdateKind, api_level,
};
use tandem_runtime::registry::Registry;

/// The bridge component a job chose, as the sync driver runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeChoice {
    /// The bridge component (`[bridge] plugin`).
    pub component: String,
    /// The plugin that provides it.
    pub plugin: String,
    /// `[bridge.options]` as the JSON the bridge receives.
    pub options_json: String,
    /// What the trainer must export (the first declared kind).
    pub export: UpdateKind,
    /// What every engine must apply (the last declared kind).
    pub apply: UpdateKind,
}

/// A problem of the `[bridge]` table, keyed relative to it (`plugin`, `options.KEY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeProblem {
    /// `plugin` or `options.KEY`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: String,
}

impl BridgeProblem {
    fn new(key: impl Into<String>, message: impl Into<String>, help: &str) -> BridgeProblem {
        BridgeProblem {
            key: key.into(),
            message: message.into(),
            help: help.to_owned(),
        }
    }

    /// The problem's line without its help: `bridge.KEY: message`.
    pub fn message_line(&self) -> String {
        format!("bridge.{}: {}", self.key, self.message)
    }
}

impl std::fmt::Display for BridgeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = tandem_runtime::error::render(&self.message_line(), Some(&self.help));
        f.write_str(&line)
    }
}

/// Finds the bridge component `name`, checks its level and declared kinds, and asks its
/// plugin to check `options`; every problem is returned.
pub fn resolve(
    registry: &Registry,
    name: &str,
    options: &toml::Table,
) -> Result<BridgeChoice, Vec<BridgeProblem>> {
    let bridges = registry.component_names(ComponentKind::Bridge);
    let Some((plugin, decl)) = registry.component(ComponentKind::Bridge, name) else {
        let help = format!(
            "loaded bridges: {}; a third-party bridge loads with --plugin-dir",
            if bridges.is_empty() {
                "none".to_owned()
            } else {
                bridges.join(", ")
            }
        );
        return Err(vec![BridgeProblem::new(
            "plugin",
            format!("no loaded plugin provides the bridge `{name}`"),
            &help,
        )]);
    };
    let level = plugin.manifest.api_level;
    if level < api_level::BRIDGE {
        return Err(vec![BridgeProblem::new(
            "plugin",
            format!(
                "bridge `{name}` of plugin `{}` is at API level {level}; bridges need level {}",
                plugin.manifest.name,
                api_level::BRIDGE
            ),
            "rebuild the plugin against this tandem-plugin-api",
        )]);
    }
    let kinds = &decl.caps.update_kinds;
    let (Some(&export), Some(&apply)) = (kinds.first(), kinds.last()) else {
        return Err(vec![BridgeProblem::new(
            "plugin",
            format!("bridge `{name}` declares no update kind"),
            "a bridge declares the kind the trainer exports (and the kind engines apply)",
        )]);
    };
    let options_json = crate::config::options_json(options).map_err(|e| {
        vec![BridgeProblem::new(
            "options",
            format!("cannot be passed to the bridge: {e}"),
            "use plain TOML values",
        )]
    })?;
    let config = ComponentConfig {
        component: name.into(),
        model_path: "".into(),
        options_json: options_json.as_str().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    };
    match registry.validate_config(ComponentKind::Bridge, config) {
        Ok(Some(problems)) if !problems.is_empty() => {
            return Err(problems
                .iter()
                .map(|p| {
                    let key = match p.key.as_str() {
                        "" => "options".to_owned(),
                        k => format!("options.{k}"),
                    };
                    BridgeProblem::new(key, p.message.as_str(), p.help.as_str())
                })
                .collect());
        }
        Err(e) => {
            return Err(vec![BridgeProblem::new(
                "plugin",
                e.to_string(),
                "see the plugin's log or report it to its authors",
            )]);
        }
        _ => {}
    }
    Ok(BridgeChoice {
        component: name.to_owned(),
        plugin: plugin.manifest.name.to_string(),
        options_json,
        export,
        apply,
    })
}

/// The plan a controller-side instance of the bridge answers for its options.
pub fn plan_of(registry: &Registry, choice: &BridgeChoice) -> Result<BridgePlan, RlError> {
    let name = &choice.component;
    probe(registry, choice)?
        .plan()
        .into_result()
        .map_err(|e| RlError::failed(format!("{name} bridge: its plan: {e}")))
}

/// The tags each side keeps resident with the chosen options (the bridge's `resident()`; a
/// level-4 bridge's plan tags, both sides).
pub fn resident_of(registry: &Registry, choice: &BridgeChoice) -> Result<ResidentTags, RlError> {
    let name = &choice.component;
    probe(registry, choice)?
        .resident()
        .into_result()
        .map_err(|e| RlError::failed(format!("{name} bridge: its resident tags: {e}")))
}

/// An instance of the chosen bridge in the controller, to ask it what it needs.
fn probe(registry: &Registry, choice: &BridgeChoice) -> Result<BridgeBox, RlError> {
    let config = ComponentConfig {
        component: choice.component.as_str().into(),
        model_path: "".into(),
        options_json: choice.options_json.as_str().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    };
    let services = tandem_runtime::services::Services::new();
    Ok(registry.new_bridge(config, services.handle())?)
}

/// The problems as one error: a line each, the last one's help as the error's help (the
/// edge renders it on that line, like the lines before it carry theirs).
pub(super) fn problems_error(problems: &[BridgeProblem]) -> RlError {
    let Some((last, before)) = problems.split_last() else {
        return RlError::usage("bridge: invalid settings");
    };
    let mut lines: Vec<String> = before.iter().map(ToString::to_string).collect();
    lines.push(last.message_line());
    RlError::usage(lines.join("\n")).with_help(last.help.as_str())
}
