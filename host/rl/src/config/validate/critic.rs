//! `[critic]`: PPO's value model, a second trainer component. Only PPO has one, PPO needs
//! one, it runs one rank, and its component must say (`describe_config`, with these options)
//! that it can be a value model; PPO's actor must step with per-token advantages.

use super::issues::Issues;
use super::placement::{Found, Resolved};
use crate::config::{JobFile, RolePlan};
use tandem_plugin_api::ComponentKind;
use tandem_runtime::registry::Registry;

/// The critic's component, when the job has one it can run; PPO without one, a critic
/// without PPO and a critic of more than one rank are refused at their keys.
pub(super) fn check(issues: &mut Issues<'_>, registry: &Registry, j: &JobFile) -> Resolved {
    let a = &j.algorithm;
    let Some(c) = &j.critic else {
        if a.is_ppo() {
            issues.at(
                "algorithm.name",
                "PPO trains a value model beside the policy, and the job has no [critic]",
                "add [critic] plugin = \"native\" (a trainer that can be a value model), or use \
                 name = \"grpo\"",
            );
        }
        return None;
    };
    if !a.is_ppo() {
        issues.push(
            "critic.plugin",
            Some(c.plugin.span()),
            format!(
                "[critic] is PPO's value model; algorithm `{}` has none",
                a.name
            ),
            "set [algorithm] name = \"ppo\", or remove [critic]".into(),
        );
        return None;
    }
    if c.ranks != 1 {
        issues.at(
            "critic.ranks",
            format!("the loop drives one critic worker, got ranks = {}", c.ranks),
            "set ranks = 1",
        );
    }
    if !(0.0..=1.0).contains(&a.gamma) || !(0.0..=1.0).contains(&a.lambda) {
        let key = if (0.0..=1.0).contains(&a.gamma) {
            "algorithm.lambda"
        } else {
            "algorithm.gamma"
        };
        issues.at(
            key,
            format!(
                "gamma and lambda are in [0, 1], got gamma = {}, lambda = {}",
                a.gamma, a.lambda
            ),
            "e.g. gamma = 1.0, lambda = 0.95",
        );
    }
    if a.value_clip < 0.0 || a.critic_lr() <= 0.0 || !a.critic_lr().is_finite() {
        issues.at(
            "algorithm.value_clip",
            format!(
                "value_clip must be >= 0 and the critic's learning rate > 0, got {} and {}",
                a.value_clip,
                a.critic_lr()
            ),
            "e.g. value_clip = 0.2, critic_learning_rate = 1e-3",
        );
    }
    match registry.component(ComponentKind::Trainer, c.plugin.get_ref()) {
        Some((plugin, decl)) => Some(Found::of(plugin, decl)),
        None => {
            let known = registry.component_names(ComponentKind::Trainer);
            issues.push(
                "critic.plugin",
                Some(c.plugin.span()),
                format!(
                    "unknown trainer plugin `{}` for the critic",
                    c.plugin.get_ref()
                ),
                format!("known trainers: {}", known.join(", ")),
            );
            None
        }
    }
}

/// What the components can do with their options: the critic must be able to be a value
/// model, PPO's actor must step with per-token advantages.
pub(super) fn check_caps(
    issues: &mut Issues<'_>,
    j: &JobFile,
    critic: Option<&RolePlan>,
    trainer: &RolePlan,
) {
    if let (Some(c), Some(section)) = (critic, &j.critic)
        && !c.caps.value_model
    {
        issues.push(
            "critic.plugin",
            Some(section.plugin.span()),
            format!(
                "trainer `{}` cannot be a value model ({}: no value_model)",
                c.component,
                c.caps.source.describe()
            ),
            "use a trainer whose plugin declares value_model with these options \
             (plugin = \"native\")"
                .into(),
        );
    }
    if j.algorithm.is_ppo() && !trainer.caps.token_advantages {
        issues.at(
            "trainer.plugin",
            format!(
                "PPO's actor steps with a per-token advantage, and trainer `{}` does not \
                 ({}: no token_advantages)",
                trainer.component,
                trainer.caps.source.describe()
            ),
            "use a trainer that declares token_advantages (plugin = \"native\"), or \
             [algorithm] name = \"grpo\"",
        );
    }
}
