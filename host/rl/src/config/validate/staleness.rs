//! `[algorithm] max_staleness` and `correction`: the combinations that cannot honour the
//! staleness bound or the correction, each one line at its key. With k ≥ 1 the engines
//! generate while the trainer trains, so they need devices of their own (a disaggregated
//! placement), weights of their own (not the trainer's memory served in place, as `ipc`
//! does), and no drafter trained in the rollout's bubbles; PPO's critic is not part of it.
//! A correction other than `none` weights each token's advantage, which only a trainer that
//! takes per-token advantages can train with.

use super::issues::Issues;
use crate::config::{BridgeSetup, Correction, JobFile, PlacementMode, RolePlan};

/// The memory tag of the weights (the bridge's resident tags name it).
const WEIGHTS: &str = "weights";

/// Checks the staleness bound and the correction against the placement, the bridge, the
/// drafter, the algorithm and the trainer.
pub(super) fn check(
    issues: &mut Issues<'_>,
    j: &JobFile,
    bridge: Option<&BridgeSetup>,
    trainer: Option<&RolePlan>,
) {
    let a = &j.algorithm;
    if !(a.is_cap.is_finite() && a.is_cap >= 1.0) {
        issues.at(
            "algorithm.is_cap",
            format!("must be a number >= 1, got {}", a.is_cap),
            "it truncates tis's importance weights, e.g. is_cap = 2.0",
        );
    }
    let correction = a.correction();
    if correction != Correction::None
        && let Some(t) = trainer
        && !t.caps.token_advantages
    {
        issues.at(
            "algorithm.correction",
            format!(
                "correction = \"{}\" weights each token's advantage, and trainer `{}` takes \
                 one advantage per sequence ({}: no token_advantages)",
                correction.name(),
                t.component,
                t.caps.source.describe()
            ),
            "use a trainer that declares token_advantages (plugin = \"native\"), or set \
             correction = \"none\"",
        );
    }
    let k = a.max_staleness;
    if k == 0 || j.is_drafter_job() {
        return;
    }
    if j.placement.mode == PlacementMode::Colocate {
        issues.at(
            "algorithm.max_staleness",
            format!(
                "max_staleness = {k} generates while the trainer trains, and placement \
                 `colocate` has engines and trainer take turns on the same devices"
            ),
            "set [placement] mode = \"disaggregated\" (on CPU, give each role its cores with \
             [placement.cpus]), or max_staleness = 0",
        );
    }
    if a.is_ppo() {
        issues.at(
            "algorithm.max_staleness",
            format!("max_staleness = {k} runs GRPO only: PPO's critic values the current policy's samples"),
            "set name = \"grpo\", or max_staleness = 0",
        );
    }
    if j.drafter.enabled {
        issues.at(
            "algorithm.max_staleness",
            format!(
                "max_staleness = {k} keeps the engines generating, and the drafter trains in \
                 the bubbles between rollouts"
            ),
            "set [drafter] enabled = false, or max_staleness = 0",
        );
    }
    if let Some(b) = bridge {
        let r = &b.resident;
        let in_place = r.trainer.iter().any(|t| t.as_str() == WEIGHTS)
            && r.engines.iter().any(|t| t.as_str() == WEIGHTS);
        if in_place {
            issues.at(
                "bridge.plugin",
                format!(
                    "bridge `{}` has the engines serve the trainer's weights in place: with \
                     max_staleness = {k} they would generate from weights the trainer is \
                     changing",
                    b.component
                ),
                "use plugin = \"broadcast\" or \"checkpoint\" (the engines hold their own \
                 copy), or max_staleness = 0",
            );
        }
    }
}
