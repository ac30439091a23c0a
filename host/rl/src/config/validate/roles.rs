//! Each role's component with its options: the options made into the JSON every rank
//! receives (once), checked by the component's plugin (`validate_config`, API level 2; level-1
//! plugins are skipped) with rank 0's config as the run builds it, and the capabilities the
//! component has with them (`describe_config`, API level 5; the manifest below it).

use super::issues::Issues;
use super::placement::Found;
use crate::config::plan::{ComponentCaps, RankPlan, RolePlan, absolute, device_of, options_json};
use std::path::Path;
use tandem_plugin_api::{ComponentKind, ConfigProblem};
use tandem_runtime::registry::Registry;

/// Where the run puts a component: what its config carries besides the options.
pub(super) struct Site<'a> {
    pub registry: &'a Registry,
    pub model_path: &'a Path,
    pub devices: &'a [String],
    pub run_dir: &'a Path,
}

/// One role as the job file has it.
pub(super) struct Role<'a> {
    pub kind: ComponentKind,
    /// The job-file section the options are under (`engine`, `trainer`, `drafter`).
    pub section: &'a str,
    /// The component the registry found.
    pub found: Found,
    /// Its options table.
    pub table: &'a toml::Table,
    /// Ranks (1 for the drafter trainer).
    pub ranks: u32,
    /// Devices of its ranks start at this rank's (the drafter trainer: after the trainer's).
    pub first_device: u32,
    /// Engines: release memory in the drained offload.
    pub needs_offload: bool,
}

/// The role's plan, after its plugin checked the options; `None` when they cannot be made
/// into JSON (an issue is recorded).
pub(super) fn plan(issues: &mut Issues<'_>, site: &Site<'_>, r: Role<'_>) -> Option<RolePlan> {
    let options_key = format!("{}.options", r.section);
    let json = match options_json(r.table) {
        Ok(json) => json,
        Err(e) => {
            issues.at(
                &options_key,
                format!("cannot be handed to the plugin as JSON: {e}"),
                "use strings, numbers, booleans, arrays and tables only",
            );
            return None;
        }
    };
    let f = &r.found;
    let mut role = RolePlan {
        component: f.component.clone(),
        plugin: f.plugin.clone(),
        source: f.source.clone(),
        api_level: f.api_level,
        caps: ComponentCaps::from_manifest(&f.caps),
        releasable_tags: f
            .caps
            .releasable_tags
            .iter()
            .map(ToString::to_string)
            .collect(),
        needs_offload: r.needs_offload,
        options_json: json,
        ranks: (0..r.ranks)
            .map(|rank| RankPlan {
                rank,
                device: device_of(site.devices, r.first_device + rank),
            })
            .collect(),
        model_path: absolute(site.model_path),
    };
    let config = role.config(0, site.run_dir);
    match site.registry.validate_config(r.kind, config.clone()) {
        Ok(None) => {}
        Ok(Some(problems)) => {
            for p in problems {
                report(issues, &options_key, &r, &p);
            }
        }
        Err(e) => issues.at(
            &options_key,
            e.to_string(),
            "this is a bug in the plugin; report it",
        ),
    }
    match site.registry.describe_config(r.kind, config) {
        Ok(Some(caps)) => role.caps = ComponentCaps::from_answer(&caps, &f.caps),
        Ok(None) => {}
        Err(e) => issues.at(
            &options_key,
            e.to_string(),
            "this is a bug in the plugin; report it",
        ),
    }
    Some(role)
}

/// One problem the plugin found, at its key under `options_key`.
fn report(issues: &mut Issues<'_>, options_key: &str, r: &Role<'_>, p: &ConfigProblem) {
    let f = &r.found;
    let what = format!(
        "{} `{}` (plugin `{}`)",
        r.kind.as_str(),
        f.component,
        f.plugin
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
