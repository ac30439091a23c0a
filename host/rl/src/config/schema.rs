//! The job-file schema. Every table denies unknown keys; free-form plugin options live in
//! `[engine.options]` / `[trainer.options]` / `[bridge.options]` and are handed to the plugin as JSON.

mod algorithm;

pub use algorithm::*;

use super::launcher::LauncherSection;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use toml::Spanned;

/// A whole job file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// Run-level settings.
    #[serde(default)]
    pub run: RunSection,
    /// Where to look for dynamic plugins.
    #[serde(default)]
    pub plugins: PluginsSection,
    /// Where workers go and how much memory each side may use.
    #[serde(default)]
    pub placement: PlacementSection,
    /// The model.
    pub model: ModelSection,
    /// The inference engine.
    pub engine: EngineSection,
    /// The trainer.
    pub trainer: TrainerSection,
    /// The weight bridge.
    pub bridge: BridgeSection,
    /// The value model of PPO (`[algorithm] name = "ppo"`): a second trainer component.
    #[serde(default)]
    pub critic: Option<TrainerSection>,
    /// The RL algorithm.
    #[serde(default)]
    pub algorithm: AlgorithmSection,
    /// The environment: the problems and their rewards (see [`JobFile::environment`]).
    #[serde(default)]
    pub environment: Option<EnvironmentSection>,
    /// `[task]`: the older name of `[environment]` (its `kind` is `plugin`).
    #[serde(default)]
    pub task: Option<EnvironmentSection>,
    /// Held-out evaluation during the run.
    #[serde(default)]
    pub eval: EvalSection,
    /// Drafter training (`[algorithm] name = "drafter"`).
    #[serde(default)]
    pub drafter: DrafterSection,
    /// Memory-layer settings.
    #[serde(default)]
    pub memory: MemorySection,
    /// Transport-layer settings.
    #[serde(default)]
    pub transport: TransportSection,
    /// Where the workers start.
    #[serde(default)]
    pub launcher: LauncherSection,
    /// Experiment trackers (TensorBoard, Weights & Biases, MLflow).
    #[serde(default)]
    pub logging: tandem_track::LoggingSection,
}

impl JobFile {
    /// The environment section: `[environment]`, else `[task]`, else the default
    /// (arithmetic). Validation refuses a file with both tables.
    pub fn environment(&self) -> &EnvironmentSection {
        static DEFAULT: std::sync::OnceLock<EnvironmentSection> = std::sync::OnceLock::new();
        self.environment
            .as_ref()
            .or(self.task.as_ref())
            .unwrap_or_else(|| DEFAULT.get_or_init(EnvironmentSection::default))
    }

    /// The table the environment came from (`environment` or `task`): where its keys are.
    pub fn environment_table(&self) -> &'static str {
        if self.environment.is_none() && self.task.is_some() {
            "task"
        } else {
            "environment"
        }
    }

    /// Whether this is a drafter-training job (`[algorithm] name = "drafter"`).
    pub fn is_drafter_job(&self) -> bool {
        self.algorithm.name == "drafter"
    }
}

/// `[run]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Run name (used in output).
    pub name: String,
    /// Run directory (metrics, plot, checkpoints); relative to the job file.
    pub output_dir: PathBuf,
    /// Number of RL steps.
    pub steps: u32,
    /// Seed of everything random.
    pub seed: u64,
    /// Save a checkpoint every N steps (0: only at the end).
    pub save_every: u32,
    /// Append every rollout sample (prompt, completion, tokens, logprobs, reward, advantage)
    /// to `<run_dir>/rollouts.jsonl`.
    pub dump_rollouts: bool,
    /// Restarts of one worker rank (an engine rank, the trainer) the run survives; one more
    /// death of that rank stops the run. 0: any worker death stops the run.
    pub max_restarts: u32,
    /// Restarts of all workers together the run survives.
    pub max_restarts_per_run: u32,
    /// Wait before a rank's first restart (s); doubled for each later restart of that rank,
    /// at most 60 s.
    pub restart_backoff_secs: f64,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            name: "tandem-run".into(),
            output_dir: PathBuf::from("runs/tandem-run"),
            steps: 20,
            seed: 0,
            save_every: 0,
            dump_rollouts: false,
            max_restarts: 3,
            max_restarts_per_run: 10,
            restart_backoff_secs: 1.0,
        }
    }
}

/// `[plugins]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsSection {
    /// Directories scanned for plugin libraries; relative to the job file.
    pub dirs: Vec<PathBuf>,
}

/// Colocated (engine and trainer share devices) or disaggregated placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlacementMode {
    /// Engine and trainer share each device and take turns.
    #[default]
    Colocate,
    /// Engine and trainer on separate devices.
    Disaggregated,
}

/// `[placement]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementSection {
    /// Placement mode.
    pub mode: PlacementMode,
    /// Devices (`cpu`, `cuda:0`, ...).
    pub devices: Vec<String>,
    /// Fraction of each device's memory the trainer may use.
    pub train_frac: Spanned<f64>,
    /// Fraction of each device's memory the engine may use.
    pub infer_frac: Spanned<f64>,
    /// CPU cores each role's workers run on (`[placement.cpus]`).
    pub cpus: CpuPins,
}

/// `[placement.cpus]`: the CPU cores each role's workers (and the processes they start) run
/// on, e.g. engine on core 0 and trainer on core 1 of a 2-core machine; empty: all.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CpuPins {
    /// Cores of every engine rank.
    pub engine: Vec<u32>,
    /// Cores of every trainer rank (the drafter trainer and PPO's critic too).
    pub trainer: Vec<u32>,
}

impl Default for PlacementSection {
    fn default() -> Self {
        PlacementSection {
            mode: PlacementMode::Colocate,
            devices: vec!["cpu".into()],
            train_frac: Spanned::new(0..0, 0.45),
            infer_frac: Spanned::new(0..0, 0.45),
            cpus: CpuPins::default(),
        }
    }
}

/// `[model]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Hugging Face model directory; relative to the job file.
    pub path: PathBuf,
    /// Preset to create the model from when `path` does not exist (`tiny`, `small`).
    #[serde(default)]
    pub init_preset: Option<String>,
    /// Supervised warm-start steps on the job's task when the model is created from
    /// `init_preset` (0: none), so RL starts with signal.
    #[serde(default)]
    pub warm_start_steps: u32,
}

/// `[engine]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    /// Engine component name (e.g. `native`, `vllm`).
    pub plugin: Spanned<String>,
    /// Number of engine ranks.
    #[serde(default = "one")]
    pub ranks: u32,
    /// Whether the drained offload releases this engine's memory.
    #[serde(default = "yes")]
    pub needs_offload: bool,
    /// Free-form options for the plugin.
    #[serde(default)]
    pub options: toml::Table,
}

/// `[trainer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerSection {
    /// Trainer component name (e.g. `native`, `fsdp`).
    pub plugin: Spanned<String>,
    /// Number of trainer ranks.
    #[serde(default = "one")]
    pub ranks: u32,
    /// Free-form options for the plugin.
    #[serde(default)]
    pub options: toml::Table,
}

/// `[bridge]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSection {
    /// The bridge component: the built-ins `ipc`, `lora`, `checkpoint`, `broadcast`, or a
    /// third-party plugin's (`mode` is the same key under its older name).
    #[serde(alias = "mode")]
    pub plugin: Spanned<String>,
    /// Check after every sync that the engine serves the trainer's weights.
    #[serde(default = "yes")]
    pub verify: bool,
    /// Free-form options for the bridge.
    #[serde(default)]
    pub options: toml::Table,
}

/// `[environment]` (or `[task]`, its older name).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvironmentSection {
    /// The environment component (`tandem plugins` lists them); `kind` is its older name.
    #[serde(alias = "kind")]
    pub plugin: String,
    /// Render each prompt through the model's chat template (a user message, after the
    /// system message when `system` is set, with the assistant's turn opened).
    pub chat: bool,
    /// The system message of chat prompts (needs `chat = true`).
    pub system: Option<String>,
    /// The environment's options (kept as JSON values: nothing below validation holds TOML).
    pub options: serde_json::Map<String, serde_json::Value>,
    /// Largest fraction of a step's samples whose reward may fail (a raise, a timeout, a dead
    /// worker, a value out of range); past it the run stops with one line. Failed samples are
    /// counted and never trained on.
    pub max_failed_frac: f64,
    /// Built-in tools the model may call (`calculate`): each rollout becomes multi-turn, the
    /// tools' answers rendered as the template's tool messages (`crate::turns`).
    pub tools: Vec<String>,
    /// The tool-call format (`hermes`, `llama3`); default: the one the chat template teaches.
    pub tool_format: Option<String>,
    /// The system text that shows the model its tools and how to call them (default: a
    /// short one per format, `crate::turns::ToolUse::instructions`); appended to `system`.
    pub tool_prompt: Option<String>,
    /// Assistant turns per trajectory with tools (the last one gets no tool answer).
    pub max_turns: u32,
    /// Tokens a trajectory may hold after its prompt, the model's and the tools' (default:
    /// `max_turns × [algorithm] max_tokens`); a trajectory past it ends.
    pub max_trajectory_tokens: Option<u32>,
}

impl Default for EnvironmentSection {
    fn default() -> Self {
        EnvironmentSection {
            plugin: "arithmetic".into(),
            chat: false,
            system: None,
            options: serde_json::Map::new(),
            max_failed_frac: 0.1,
            tools: Vec::new(),
            tool_format: None,
            tool_prompt: None,
            max_turns: 4,
            max_trajectory_tokens: None,
        }
    }
}

/// `[eval]`: greedy accuracy on a fixed held-out set of the task's problems, before the first
/// step, every `every` steps and after the last one.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Evaluate every N steps (0: no evaluation).
    pub every: u32,
    /// Size of the held-out set.
    pub problems: u32,
    /// Max new tokens per answer (default: `[algorithm] max_tokens`).
    pub max_tokens: Option<u32>,
}

impl Default for EvalSection {
    fn default() -> Self {
        EvalSection {
            every: 0,
            problems: 64,
            max_tokens: None,
        }
    }
}

impl EvalSection {
    /// Whether the run evaluates.
    pub fn enabled(&self) -> bool {
        self.every > 0
    }
}

/// How a drafter job's hidden states travel from engine rank i to the trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FeatureRouteKind {
    /// The data plane: a transport group per (engine rank, trainer) pair — shared memory
    /// between processes of one host — into the trainer's preallocated receive region.
    #[default]
    Transport,
    /// Through the control plane (the controller relays them): for comparison only.
    Control,
}

/// When an RL run's drafter trains (`[drafter] train_in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TrainIn {
    /// In the rollout's bubbles: a rank whose share is done trains the drafter while the
    /// other ranks still generate (FastRL's idea, overlapped for real).
    #[default]
    Bubbles,
    /// After every rank's rollout (sequential, as FastRL runs it).
    AfterRollout,
    /// Never: the engines speculate with the drafter they were given.
    Off,
}

impl TrainIn {
    /// The name in job files.
    pub fn as_str(self) -> &'static str {
        match self {
            TrainIn::Bubbles => "bubbles",
            TrainIn::AfterRollout => "after_rollout",
            TrainIn::Off => "off",
        }
    }
}

/// `[drafter]`: a speculative-decoding drafter (EAGLE-3).
///
/// In a drafter-training job (`[algorithm] name = "drafter"`) the engines generate for the
/// task's prompts, send the hidden states of every sequence to the trainer, which steps the
/// drafter; every `eval_every` steps the engines load the drafter and decode the held-out
/// prompts speculatively, reporting the mean acceptance length (`route`, `eval_*`,
/// `ignore_eos`).
///
/// In an RL job (`enabled = true`) a drafter trainer worker (`plugin`, `options`) trains the
/// drafter on the hidden states of the rollouts (`train_in`, `max_steps_per_bubble`,
/// `min_ranks_for_training`, `train_every_n_steps`, `learning_rate`,
/// `activation_timeout_secs`); the trained drafter reaches the engines after every step's
/// weight sync, and they speculate while at most `speculate_below_batch` rows decode (the
/// long tail) and while the measured acceptance stays at or above `min_acceptance`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrafterSection {
    /// How hidden states travel (drafter job).
    pub route: FeatureRouteKind,
    /// Measure the acceptance length every N steps (0: only after the last step; drafter
    /// job).
    pub eval_every: u32,
    /// Held-out prompts of the acceptance measurement (drafter job).
    pub eval_prompts: u32,
    /// Max new tokens of the acceptance measurement (default: `[algorithm] max_tokens`;
    /// drafter job).
    pub eval_max_tokens: Option<u32>,
    /// Generate past end-of-sequence tokens (always `max_tokens` per completion), so short
    /// answers still give the drafter sequences to learn (drafter job).
    pub ignore_eos: bool,
    /// An RL run trains a drafter and speculates with it.
    pub enabled: bool,
    /// The drafter trainer component (RL run).
    pub plugin: String,
    /// The drafter trainer's options, handed to it as JSON (RL run): e.g. `ttt_steps`,
    /// `max_tokens` (feature rows per step), `drafter` (start from a drafter directory).
    pub options: toml::Table,
    /// When the drafter trains (RL run).
    pub train_in: TrainIn,
    /// Drafter steps one bubble may take at most (RL run).
    pub max_steps_per_bubble: u32,
    /// Drafter steps a bubble takes even when the last engine finishes first, once a rank
    /// finished early (0: drafter steps only while an engine still generates, so the drafter
    /// never lengthens a step by more than the step in flight; RL run).
    pub min_steps_per_bubble: u32,
    /// Ranks that must have finished their share before the drafter trains
    /// (FastRL's `min_workers_for_training`; RL run).
    pub min_ranks_for_training: u32,
    /// Train the drafter on every N-th step's rollouts (RL run).
    pub train_every_n_steps: u32,
    /// The drafter's learning rate (RL run).
    pub learning_rate: f64,
    /// Seconds the drafter trainer may take to come back from its offload (its regions
    /// resumed) before the bubble is given up (FastRL: 30 s; RL run).
    pub activation_timeout_secs: f64,
    /// The engines speculate only while at most this many rows decode (RL run; the engine
    /// option of the same name).
    pub speculate_below_batch: Option<u32>,
    /// Speculation switches off while the acceptance length falls below this, and back on
    /// once the drafter's training accuracy predicts it again (0: never off; RL run).
    pub min_acceptance: f64,
}

impl Default for DrafterSection {
    fn default() -> Self {
        DrafterSection {
            route: FeatureRouteKind::Transport,
            eval_every: 50,
            eval_prompts: 32,
            eval_max_tokens: None,
            ignore_eos: false,
            enabled: false,
            plugin: "native-drafter".into(),
            options: toml::Table::new(),
            train_in: TrainIn::Bubbles,
            max_steps_per_bubble: 8,
            min_steps_per_bubble: 0,
            min_ranks_for_training: 1,
            train_every_n_steps: 1,
            learning_rate: 3e-4,
            activation_timeout_secs: 30.0,
            speculate_below_batch: None,
            min_acceptance: 0.0,
        }
    }
}

/// `[memory]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySection {
    /// Capacity of a CPU "device" in bytes (default: MemTotal).
    pub cpu_capacity_bytes: Option<u64>,
}

/// `[transport]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransportSection {
    /// `auto`, `shm`, `tcp` or `nccl`.
    pub backend: String,
    /// Seconds before a silent peer is declared dead.
    pub timeout_secs: f64,
}

impl Default for TransportSection {
    fn default() -> Self {
        TransportSection {
            backend: "auto".into(),
            timeout_secs: 60.0,
        }
    }
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}
