//! `[launcher]` of a job file: how the workers start (children of the controller, `srun`
//! steps, or Ray actors in a placement group) and how they reach the controller.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How the workers start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LauncherKind {
    /// Children of the controller, on this machine.
    #[default]
    Local,
    /// One `srun` step per worker, on the nodes named below.
    Slurm,
    /// One actor per worker in a Ray placement group (the controller runs on a Ray node).
    Ray,
}

/// A Ray placement group's strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RayStrategy {
    /// As few nodes as possible, others when needed.
    #[default]
    Pack,
    /// Across nodes where possible.
    Spread,
    /// All bundles on one node, or none placed.
    StrictPack,
    /// Every bundle on its own node, or none placed.
    StrictSpread,
}

impl RayStrategy {
    /// The name Ray takes (`PACK`, `STRICT_SPREAD`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RayStrategy::Pack => "PACK",
            RayStrategy::Spread => "SPREAD",
            RayStrategy::StrictPack => "STRICT_PACK",
            RayStrategy::StrictSpread => "STRICT_SPREAD",
        }
    }
}

/// `[launcher]`: where the workers start and how they reach the controller.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LauncherSection {
    /// `local` (default), `slurm` or `ray`.
    pub kind: LauncherKind,
    /// The controller's address the workers dial (an IP of this machine they can route to);
    /// required with `slurm` and `ray`. The control plane listens on it; the run token keeps
    /// others out.
    pub advertise: Option<String>,
    /// The node of each engine rank (one name: all of them; empty: the launcher chooses).
    /// Slurm: node names; Ray: node IPs (the bundle asks for Ray's `node:<ip>` resource).
    pub engine_nodes: Vec<String>,
    /// The node of each trainer rank, as for engines.
    pub trainer_nodes: Vec<String>,
    /// Slurm: `--partition`.
    pub partition: Option<String>,
    /// Slurm: extra `srun` arguments.
    pub srun_args: Vec<String>,
    /// Ray: the cluster's address (`auto`: `RAY_ADDRESS` or the cluster of this node).
    pub address: Option<String>,
    /// Ray: the placement group's strategy.
    pub strategy: RayStrategy,
    /// Ray: what each rank's bundle reserves (default `{ CPU = 1 }`).
    pub resources: std::collections::BTreeMap<String, f64>,
    /// Ray: a python with `ray` (default: `$TANDEM_RAY_PYTHON`, then the one
    /// `scripts/setup-ray.sh` recorded).
    pub python: Option<PathBuf>,
}

impl LauncherSection {
    /// What each rank's Ray bundle reserves: `resources`, `{ CPU = 1 }` when empty.
    pub fn ray_resources(&self) -> std::collections::BTreeMap<String, f64> {
        if self.resources.is_empty() {
            std::collections::BTreeMap::from([("CPU".to_string(), 1.0)])
        } else {
            self.resources.clone()
        }
    }
}
