//! `[drafter]`. A drafter-training job (`[algorithm] name = "drafter"`) needs an engine and a
//! trainer that speak hidden states (API level 3, `hidden_states` declared), one trainer
//! rank, the `checkpoint` bridge (the drafter moves as a directory) and a held-out set to
//! measure acceptance on. An RL job with `[drafter] enabled` needs an engine that speaks
//! hidden states, a drafter trainer component that trains on them (`[drafter] plugin`, its
//! options checked by its plugin like `[trainer.options]`) and settings it can run with.

use super::issues::Issues;
use super::placement::{Found, Resolved};
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

/// The checks of an RL job's `[drafter]` (none unless `enabled`); the drafter trainer
/// component when it resolves.
pub(super) fn check_rl(issues: &mut Issues<'_>, registry: &Registry, j: &JobFile) -> Resolved {
    if j.is_drafter_job() || !j.drafter.enabled {
        return None;
    }
    let d = &j.drafter;
    if let Some((plugin, decl)) =
        registry.component(ComponentKind::Engine, j.engine.plugin.get_ref())
        && (plugin.manifest.api_level < api_level::HIDDEN || !decl.caps.hidden_states)
    {
        issues.at(
            "drafter.enabled",
            format!(
                "engine `{}` does not send hidden states, which the drafter trains on",
                j.engine.plugin.get_ref()
            ),
            "use an engine that declares hidden_states (plugin = \"native\"), or set enabled = false",
        );
    }
    let resolved = match registry.component(ComponentKind::Trainer, &d.plugin) {
        None => {
            issues.at(
                "drafter.plugin",
                format!("unknown drafter trainer `{}`", d.plugin),
                "use plugin = \"native-drafter\"",
            );
            None
        }
        Some((plugin, decl))
            if plugin.manifest.api_level < api_level::HIDDEN || !decl.caps.hidden_states =>
        {
            issues.at(
                "drafter.plugin",
                format!(
                    "trainer `{}` does not declare that it can train a drafter on hidden states",
                    d.plugin
                ),
                "use plugin = \"native-drafter\"",
            );
            None
        }
        Some((plugin, decl)) => Some(Found::of(plugin, decl)),
    };
    let at_least_one = [
        ("drafter.max_steps_per_bubble", d.max_steps_per_bubble),
        ("drafter.train_every_n_steps", d.train_every_n_steps),
        ("drafter.min_ranks_for_training", d.min_ranks_for_training),
    ];
    for (key, v) in at_least_one {
        if v == 0 {
            issues.at(key, "must be at least 1", "");
        }
    }
    if d.min_steps_per_bubble > d.max_steps_per_bubble {
        issues.at(
            "drafter.min_steps_per_bubble",
            format!(
                "{} is above max_steps_per_bubble = {}",
                d.min_steps_per_bubble, d.max_steps_per_bubble
            ),
            "lower it, or raise max_steps_per_bubble",
        );
    }
    if d.min_ranks_for_training > j.engine.ranks {
        issues.at(
            "drafter.min_ranks_for_training",
            format!(
                "{} ranks must finish before the drafter trains, but the job has {} engine ranks",
                d.min_ranks_for_training, j.engine.ranks
            ),
            format!("set it to at most {}", j.engine.ranks),
        );
    }
    if !(d.learning_rate > 0.0 && d.learning_rate.is_finite()) {
        issues.at(
            "drafter.learning_rate",
            format!("must be > 0, got {}", d.learning_rate),
            "e.g. 0.0003",
        );
    }
    if !(d.activation_timeout_secs > 0.0 && d.activation_timeout_secs.is_finite()) {
        issues.at(
            "drafter.activation_timeout_secs",
            format!("must be > 0, got {}", d.activation_timeout_secs),
            "FastRL waits 30 s",
        );
    }
    if d.speculate_below_batch.is_some() {
        issues.at(
            "drafter.speculate_below_batch",
            "is an option of the engine now, not of [drafter]",
            "move it to [engine.options] (the engine speculates while at most that many rows decode)",
        );
    }
    if !(d.min_acceptance >= 0.0 && d.min_acceptance.is_finite()) {
        issues.at(
            "drafter.min_acceptance",
            format!("must be >= 0, got {}", d.min_acceptance),
            "0 never switches speculation off; e.g. 1.5",
        );
    }
    resolved
}
