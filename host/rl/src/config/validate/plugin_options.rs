//! `[engine.options]` / `[trainer.options]`: each plugin checks its own options
//! (`validate_config`, API level 2; level-1 plugins are skipped), with rank 0's component
//! config as the run builds it for the worker.

use super::issues::Issues;
use crate::config::plan::{ResolvedComponent, absolute, device_of, options_json};
use std::path::Path;
use tandem_plugin_api::{ComponentConfig, ComponentKind, ConfigProblem};
use tandem_runtime::registry::Registry;

/// Where the run puts a component: what its config carries besides the options.
pub(super) struct Site<'a> {
    pub registry: &'a Registry,
    pub model_path: &'a Path,
    pub devices: &'a [String],
    pub run_dir: &'a Path,
}

/// One component's options, as the job file has them.
pub(super) struct Options<'a> {
    pub kind: ComponentKind,
    /// The job-file section the options are under (`engine`, `trainer`, `drafter`).
    pub section: &'a str,
    pub component: &'a ResolvedComponent,
    pub table: &'a toml::Table,
}

/// Asks the component's plugin to check `[SECTION.options]`; its problems go to their keys.
pub(super) fn check(issues: &mut Issues<'_>, site: &Site<'_>, o: &Options<'_>) {
    let options_key = format!("{}.options", o.section);
    let json = match options_json(o.table) {
        Ok(json) => json,
        Err(e) => {
            issues.at(
                &options_key,
                format!("cannot be handed to the plugin as JSON: {e}"),
                "use strings, numbers, booleans, arrays and tables only",
            );
            return;
        }
    };
    let c = o.component;
    let config = ComponentConfig {
        component: c.component.as_str().into(),
        model_path: absolute(site.model_path).to_string_lossy().as_ref().into(),
        options_json: json.as_str().into(),
        rank: 0,
        world_size: c.ranks,
        device: device_of(site.devices, 0).as_str().into(),
        run_dir: absolute(site.run_dir).to_string_lossy().as_ref().into(),
    };
    match site.registry.validate_config(o.kind, config) {
        Ok(None) => {}
        Ok(Some(problems)) => {
            for p in problems {
                report(issues, &options_key, o, &p);
            }
        }
        Err(e) => issues.at(
            &options_key,
            e.to_string(),
            "this is a bug in the plugin; report it",
        ),
    }
}

/// One problem the plugin found, at its key under `options_key`.
fn report(issues: &mut Issues<'_>, options_key: &str, o: &Options<'_>, p: &ConfigProblem) {
    let c = o.component;
    let what = format!(
        "{} `{}` (plugin `{}`)",
        o.kind.as_str(),
        c.component,
        c.plugin
    );
    let key = if p.key.is_empty() {
        options_key.to_owned()
    } else {
        format!("{options_key}.{}", p.key)
    };
    let help = if p.help.is_empty() {
        format!("see `tandem plugins` for the {what}")
    } else {
        p.help.to_string()
    };
    issues.at(&key, format!("{what}: {}", p.message), help);
}
