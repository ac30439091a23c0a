//! The typed plan a job file resolves to: [`RunPlan`]. Validation (`super::validate`) builds
//! it once; `tandem check` prints it (`Display`, `--json` through serde) and `tandem run`
//! executes it: nothing below validation reads the job file or a TOML table.
//!
//! Per role, the plan carries the component, where it came from, the capabilities it has
//! *with these options* ([`ComponentCaps`]: the plugin's `describe_config` at API level 5,
//! the manifest's declaration below it) and every rank's component config (the options as
//! the JSON the plugin receives, made once here). The bridge carries its choice and the
//! plan its component answered; the placement and the transport groups are values; the
//! drafter, eval and launcher settings have every default resolved.

mod caps;
mod display;

pub use caps::{CapsSource, ComponentCaps};

use super::{
    AlgorithmSection, EnvironmentSection, FeatureRouteKind, LauncherSection, MemorySection,
    PlacementMode, RunSection, TrainIn,
};
use serde::Serialize;
use std::path::{Path, PathBuf};
use tandem_plugin_api::{BridgePlan, ComponentConfig, ResidentTags, UpdateKind};

/// What a job file resolved to: everything a run executes.
#[derive(Debug, Clone, Serialize)]
pub struct RunPlan {
    /// Run name (`[run] name`).
    pub name: String,
    /// The validated job file: where it was and its text (copied into the run directory so
    /// `--resume` finds it; never parsed below validation).
    pub job: JobRecord,
    /// Run directory (absolute or relative to the working directory).
    pub output_dir: PathBuf,
    /// `[run]`: steps, seed, checkpoints, restarts.
    pub run: RunSection,
    /// The model.
    pub model: ModelPlan,
    /// Placement and memory fractions.
    pub placement: PlacementPlan,
    /// The engine role.
    pub engine: RolePlan,
    /// The trainer role.
    pub trainer: RolePlan,
    /// PPO's value model (`[critic]`): trainer rank `N` after the policy's `N` ranks (and
    /// the drafter's), on the trainer's first device.
    pub critic: Option<RolePlan>,
    /// The weight bridge.
    pub bridge: BridgeSetup,
    /// `[algorithm]`.
    pub algorithm: AlgorithmSection,
    /// `[environment]` and where its relative paths resolve.
    pub environment: EnvPlan,
    /// The held-out evaluation of an RL run (`None`: `[eval] every = 0`).
    pub eval: Option<EvalPlan>,
    /// The drafter: a drafter job's measurement, or an RL run's drafter trainer.
    pub drafter: DrafterPlan,
    /// `[memory]`.
    pub memory: MemorySection,
    /// The transport: backend, timeout and the backend chosen per group.
    pub transport: TransportPlan,
    /// `[launcher]`: how the workers start and where.
    pub launcher: LauncherPlan,
    /// `[logging]`: the trackers the run's metrics go to.
    pub tracking: tandem_track::TrackPlan,
}

impl RunPlan {
    /// Whether this is a drafter-training job (`[algorithm] name = "drafter"`).
    pub fn is_drafter_job(&self) -> bool {
        self.drafter.job.is_some()
    }

    /// Engine and trainer share devices (and take turns with their memory).
    pub fn colocated(&self) -> bool {
        self.placement.mode == PlacementMode::Colocate
    }
}

/// The run's environment: its section and the job file's directory (where relative paths
/// in its options resolve).
#[derive(Debug, Clone, Serialize)]
pub struct EnvPlan {
    /// `[environment]` (or `[task]`).
    pub section: EnvironmentSection,
    /// The job file's directory.
    pub base_dir: PathBuf,
}

impl EnvPlan {
    /// What builds the environment for a run seeded `seed` holding out `held_out` items.
    pub fn spec(&self, seed: u64, held_out: u32) -> crate::env::EnvSpec<'_> {
        crate::env::EnvSpec {
            section: &self.section,
            seed,
            held_out,
            base_dir: &self.base_dir,
        }
    }
}

/// The job file a plan came from.
#[derive(Debug, Clone, Serialize)]
pub struct JobRecord {
    /// Its absolute path.
    pub path: PathBuf,
    /// Its text as validated.
    #[serde(skip)]
    pub text: String,
}

/// The model a run trains.
#[derive(Debug, Clone, Serialize)]
pub struct ModelPlan {
    /// Model directory.
    pub path: PathBuf,
    /// Preset the model is created from when the directory holds none.
    pub init_preset: Option<String>,
    /// Supervised warm-start steps after creating it from the preset.
    pub warm_start_steps: u32,
}

/// `[placement]` as values.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementPlan {
    /// `colocate` or `disaggregated`.
    pub mode: PlacementMode,
    /// Devices.
    pub devices: Vec<String>,
    /// Trainer's memory fraction per device.
    pub train_frac: f64,
    /// Engine's memory fraction per device.
    pub infer_frac: f64,
    /// CPU cores of each role's workers.
    pub cpus: crate::config::CpuPins,
}

/// One role of the run (engine, trainer, drafter trainer): its component and its ranks.
#[derive(Debug, Clone, Serialize)]
pub struct RolePlan {
    /// Component name.
    pub component: String,
    /// Plugin providing it.
    pub plugin: String,
    /// Where the plugin came from.
    pub source: String,
    /// The plugin's API level.
    pub api_level: u32,
    /// What the component can do with these options.
    pub caps: ComponentCaps,
    /// Memory tags it declares releasable: the loop offloads / releases only these.
    pub releasable_tags: Vec<String>,
    /// Engines: release memory in the drained offload (`[engine] needs_offload`, colocated).
    pub needs_offload: bool,
    /// The options as the JSON every rank's component receives.
    pub options_json: String,
    /// Every rank, with its device.
    pub ranks: Vec<RankPlan>,
    /// Model directory every rank's config names.
    pub model_path: PathBuf,
}

impl RolePlan {
    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// The device of rank `rank` (the first rank's beyond the last).
    pub fn device(&self, rank: u32) -> String {
        self.ranks
            .get(rank as usize)
            .or(self.ranks.first())
            .map_or_else(|| "cpu".to_owned(), |r| r.device.clone())
    }

    /// The component config of rank `rank`, in run directory `run_dir`: what the plugin's
    /// `validate_config` saw and what its worker receives.
    pub fn config(&self, rank: u32, run_dir: &Path) -> ComponentConfig {
        ComponentConfig {
            component: self.component.as_str().into(),
            model_path: self.model_path.to_string_lossy().as_ref().into(),
            options_json: self.options_json.as_str().into(),
            rank,
            world_size: self.world_size(),
            device: self.device(rank).as_str().into(),
            run_dir: absolute(run_dir).to_string_lossy().as_ref().into(),
        }
    }
}

/// One rank of a role.
#[derive(Debug, Clone, Serialize)]
pub struct RankPlan {
    /// Rank within the role.
    pub rank: u32,
    /// Its device (`cpu`, `cuda:N`).
    pub device: String,
}

/// The weight bridge: the component the job chose and the plan it answered.
#[derive(Debug, Clone, Serialize)]
pub struct BridgeSetup {
    /// The bridge component (`[bridge] plugin`).
    pub component: String,
    /// Plugin providing it.
    pub plugin: String,
    /// `[bridge.options]` as the JSON the bridge receives.
    pub options_json: String,
    /// Update kind the trainer exports.
    #[serde(serialize_with = "caps::kind_name")]
    pub export: UpdateKind,
    /// Update kind every engine applies.
    #[serde(serialize_with = "caps::kind_name")]
    pub apply: UpdateKind,
    /// Verify every sync (`[bridge] verify`).
    pub verify: bool,
    /// What the bridge needs from the host with these options.
    pub plan: BridgePlan,
    /// Tags each side keeps resident with these options.
    pub resident: ResidentTags,
}

/// `[eval]` with its defaults resolved.
#[derive(Debug, Clone, Serialize)]
pub struct EvalPlan {
    /// Evaluate every N steps (> 0).
    pub every: u32,
    /// Size of the held-out set.
    pub problems: u32,
    /// Max new tokens per answer.
    pub max_tokens: u32,
}

/// The drafter of a run: a drafter job's settings, or an RL run's drafter trainer.
#[derive(Debug, Clone, Serialize, Default)]
pub struct DrafterPlan {
    /// A drafter-training job (`[algorithm] name = "drafter"`).
    pub job: Option<DrafterJobPlan>,
    /// An RL run that trains a drafter (`[drafter] enabled`).
    pub rl: Option<RlDrafterPlan>,
}

/// A drafter-training job's settings.
#[derive(Debug, Clone, Serialize)]
pub struct DrafterJobPlan {
    /// How hidden states travel.
    pub route: FeatureRouteKind,
    /// Measure the acceptance length every N steps (0: only after the last step).
    pub eval_every: u32,
    /// Held-out prompts of the acceptance measurement.
    pub eval_prompts: u32,
    /// Max new tokens of the acceptance measurement.
    pub eval_max_tokens: u32,
    /// Generate past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Draft tokens per verification the engines propose (their capabilities).
    pub draft_tokens: u32,
}

/// An RL run's drafter: its trainer and when it trains (see `DrafterSection`).
#[derive(Debug, Clone, Serialize)]
pub struct RlDrafterPlan {
    /// The drafter trainer: trainer rank `N` after the policy's `N` ranks.
    pub trainer: RolePlan,
    /// When the drafter trains.
    pub train_in: TrainIn,
    /// Drafter steps one bubble may take at most.
    pub max_steps_per_bubble: u32,
    /// Drafter steps a bubble takes even when the last engine finishes first.
    pub min_steps_per_bubble: u32,
    /// Ranks that must have finished their share before the drafter trains.
    pub min_ranks_for_training: u32,
    /// Train the drafter on every N-th step's rollouts.
    pub train_every_n_steps: u32,
    /// The drafter's learning rate.
    pub learning_rate: f64,
    /// Seconds the drafter trainer may take to come back from its offload.
    pub activation_timeout_secs: f64,
    /// Speculation switches off while the acceptance length falls below this.
    pub min_acceptance: f64,
    /// Draft tokens per verification the engines propose (their capabilities).
    pub draft_tokens: u32,
    /// The longest sequence the engines hold (their capabilities; 0: unknown).
    pub max_seq_len: u32,
}

/// `[launcher]` and its one-line summary.
#[derive(Debug, Clone, Serialize)]
pub struct LauncherPlan {
    /// The settings (validated).
    pub settings: LauncherSection,
    /// How the workers start and where, one line.
    pub summary: String,
}

/// The transport.
#[derive(Debug, Clone, Serialize)]
pub struct TransportPlan {
    /// Backend requested (`auto`, `shm`, `tcp`, `nccl`).
    pub backend: String,
    /// Seconds before a silent peer is declared dead.
    pub timeout_secs: f64,
    /// The backend chosen per group, one line each (`trainers [0, 1]: shm (1 pair)`).
    pub groups: Vec<String>,
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
pub(crate) fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
