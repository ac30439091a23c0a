//! `[algorithm] name = "drafter"` with `[drafter]`: a drafter-training job needs an engine
//! and a trainer that speak hidden states (API level 3, `hidden_states` declared), one
//! trainer rank, the `checkpoint` bridge (the drafter moves as a directory) and a held-out
//! set to measure acceptance on.

use super::issues::Issues;
use crate::config::JobFile;
use tandem_plugin_api::{ComponentKind, api_level};
use tandem_runtime::registry::Registry;

/// The checks of a drafter job (none for other jobs).
pub(super) fn check(issues: &mut Issues<'_>, registry: &Registry, j: &JobFile) {
    if !j.is_drafter_job() {
        return;
    }
    for (kind, name) in [
        (ComponentKind::Engine, j.engine.plugin.get_ref()),
        (ComponentKind::Trainer, j.trainer.plugin.get_ref()),
    ] {
        let section = kind.as_str();
        // An unknown component is reported by the placement checks.
        let Some((plugin, decl)) = registry.component(kind, name) else {
            continue;
        };
        if plugin.manifest.api_level < api_level::HIDDEN {
            issues.at(
                &format!("{section}.plugin"),
                format!(
                    "a drafter job needs hidden states (plugin API level {}), but plugin `{}` \
                     providing `{name}` is at API level {}",
                    api_level::HIDDEN,
                    plugin.manifest.name,
                    plugin.manifest.api_level
                ),
                "rebuild the plugin against this tandem-plugin-api",
            );
        } else if !decl.caps.hidden_states {
            let what = match kind {
                ComponentKind::Trainer => "train a drafter on hidden states",
                _ => "send hidden states",
            };
            issues.at(
                &format!("{section}.plugin"),
                format!("{section} `{name}` does not declare that it can {what}"),
                match kind {
                    ComponentKind::Trainer => "use plugin = \"native-drafter\"",
                    _ => "use plugin = \"native\"",
                },
            );
        }
    }
    if j.trainer.ranks != 1 {
        issues.at(
            "trainer.ranks",
            "a drafter job has one trainer rank; every engine rank sends it its hidden states",
            "set ranks = 1",
        );
    }
    if j.bridge.plugin.get_ref() != "checkpoint" {
        issues.push(
            super::bridge::plugin_key(issues.job),
            Some(j.bridge.plugin.span()),
            format!(
                "a drafter job moves the drafter to the engines as a directory, not with `{}`",
                j.bridge.plugin.get_ref()
            ),
            "set plugin = \"checkpoint\"".into(),
        );
    }
    let d = &j.drafter;
    if d.eval_prompts == 0 {
        issues.at(
            "drafter.eval_prompts",
            "must be at least 1",
            "it is the number of held-out prompts the acceptance length is measured on",
        );
    }
    if d.eval_max_tokens == Some(0) {
        issues.at("drafter.eval_max_tokens", "must be at least 1", "");
    }
}

/// What `tandem check` says of a drafter job's data path (`None` for other jobs).
pub(super) fn describe(j: &JobFile) -> Option<String> {
    if !j.is_drafter_job() {
        return None;
    }
    let d = &j.drafter;
    let path = match d.route {
        crate::config::FeatureRouteKind::Transport => {
            "engine rank i -> trainer over transport group pair<i> (shm on one host)"
        }
        crate::config::FeatureRouteKind::Control => "through the controller (control plane)",
    };
    let when = if d.eval_every > 0 {
        format!("every {} steps and after the last", d.eval_every)
    } else {
        "after the last step".to_string()
    };
    Some(format!(
        "hidden states {path}; acceptance length {when} on {} held-out prompts",
        d.eval_prompts
    ))
}
