//! What validation resolves a job to ([`ResolvedPlan`], printed by `tandem check`), and
//! what the run and the plugins' `validate_config` share: a component's options as JSON and
//! the device of a rank.

use super::PlacementMode;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What `tandem check` resolved a job file to.
#[derive(Debug, Clone, Serialize)]
pub struct ResolvedPlan {
    /// Run name.
    pub name: String,
    /// Run directory (absolute or relative to the working directory).
    pub output_dir: PathBuf,
    /// Model directory.
    pub model_path: PathBuf,
    /// Whether the model will be created from a preset.
    pub model_init_preset: Option<String>,
    /// `colocate` or `disaggregated`.
    pub placement: PlacementMode,
    /// Devices.
    pub devices: Vec<String>,
    /// Trainer's memory fraction per device.
    pub train_frac: f64,
    /// Engine's memory fraction per device.
    pub infer_frac: f64,
    /// The engine component.
    pub engine: ResolvedComponent,
    /// The trainer component.
    pub trainer: ResolvedComponent,
    /// The bridge.
    pub bridge: ResolvedBridge,
    /// Transport backend requested.
    pub transport: String,
    /// Transport chosen per group, one line each (e.g. `trainers [0, 1]: shm (1 pair)`).
    pub transport_groups: Vec<String>,
    /// How the workers start and where (`[launcher]`), one line.
    pub launcher: String,
    /// A drafter job's data path and measurement, or an RL job's drafter, one line.
    pub drafter: Option<String>,
    /// An RL job's drafter trainer (`[drafter] enabled`).
    pub drafter_trainer: Option<ResolvedComponent>,
}

/// A resolved engine or trainer.
#[derive(Debug, Clone, Serialize)]
pub struct ResolvedComponent {
    /// Component name.
    pub component: String,
    /// Plugin providing it.
    pub plugin: String,
    /// Where the plugin came from.
    pub source: String,
    /// Number of ranks.
    pub ranks: u32,
    /// Memory tags it declares releasable: the loop offloads / releases only these.
    pub releasable_tags: Vec<String>,
}

impl ResolvedComponent {
    /// The component `decl` of `plugin`, run on `ranks` ranks.
    pub fn of(
        plugin: &tandem_runtime::registry::LoadedPlugin,
        decl: &tandem_plugin_api::ComponentDecl,
        ranks: u32,
    ) -> ResolvedComponent {
        ResolvedComponent {
            component: decl.name.to_string(),
            plugin: plugin.manifest.name.to_string(),
            source: plugin.source.to_string(),
            ranks,
            releasable_tags: decl
                .caps
                .releasable_tags
                .iter()
                .map(ToString::to_string)
                .collect(),
        }
    }
}

/// A resolved bridge.
#[derive(Debug, Clone, Serialize)]
pub struct ResolvedBridge {
    /// The bridge component (`[bridge] plugin`).
    pub mode: String,
    /// Update kind the trainer must export (empty when the bridge is not found).
    pub export_kind: String,
    /// Update kind every engine must apply.
    pub apply_kind: String,
    /// Plugin providing the bridge, or `None` if no loaded plugin provides it.
    pub provider: Option<String>,
    /// Verify every sync.
    pub verify: bool,
}

/// What the command line changes about a job before it is validated.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Run directory instead of `[run] output_dir` (`tandem run --output-dir`, `--resume`).
    pub output_dir: Option<PathBuf>,
}

/// The options table of a component as the JSON its plugin receives.
pub fn options_json(table: &toml::Table) -> Result<String, serde_json::Error> {
    serde_json::to_string(table)
}

/// The device of rank `rank` of a role: the job's devices, round-robin (`cpu` when none).
pub fn device_of(devices: &[String], rank: u32) -> String {
    devices
        .get(rank as usize % devices.len().max(1))
        .cloned()
        .unwrap_or_else(|| "cpu".into())
}

/// `p` made absolute (as it is when that fails).
pub(super) fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
