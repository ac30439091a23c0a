//! Components: the configuration a constructor gets, problems found in its options, its
//! self-reported statistics, and log severities.

use abi_stable::StableAbi;
use abi_stable::std_types::{RString, RVec};
use serde::{Deserialize, Serialize};

/// A named scalar metric.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Metric {
    /// Metric name, e.g. `loss`, `grad_norm`, `kv_cache_bytes`.
    pub name: RString,
    /// Value.
    pub value: f64,
}

impl Metric {
    /// A metric from a name and a value.
    pub fn new(name: &str, value: f64) -> Self {
        Metric {
            name: RString::from(name),
            value,
        }
    }
}

/// A component's self-reported statistics.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ComponentStats {
    /// Weight version currently held.
    pub weight_version: u64,
    /// Free-form state name, e.g. `serving`, `paused`.
    pub state: RString,
    /// Scalar figures.
    pub metrics: RVec<Metric>,
}

/// Configuration handed to a component constructor.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ComponentConfig {
    /// Component name as declared in the manifest (the job file's `plugin = ...`).
    pub component: RString,
    /// Model directory (Hugging Face layout), empty for bridges.
    pub model_path: RString,
    /// Free-form options table from the job file, as JSON.
    pub options_json: RString,
    /// Rank of this component within its role.
    pub rank: u32,
    /// Number of ranks of this role.
    pub world_size: u32,
    /// Device, e.g. `cpu` or `cuda:0`.
    pub device: RString,
    /// Run directory for logs and scratch files.
    pub run_dir: RString,
}

/// What a component can do with the options of a job (API level
/// [`PLAN`](crate::api_level::PLAN)): the answer of the root module's `describe_config`, asked
/// by `tandem check` once the options are known. What the manifest declares is the same
/// whatever the options; this says what these options give.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct ConfigCaps {
    /// Trainer: the update kinds `export_weight_update` produces with these options (only
    /// adapters when it trains LoRA; no adapter when it fine-tunes every weight). Engine: the
    /// kinds it applies. Bridge: as its manifest.
    pub update_kinds: RVec<crate::types::UpdateKind>,
    /// Engine: draft tokens per speculative verification (0: it does not speculate).
    pub draft_tokens: u32,
    /// Engine: it speculates only while at most this many rows decode (0: not applicable).
    pub speculate_below_batch: u32,
    /// The longest prompt + completion it handles with these options (0: no limit known).
    pub max_seq_len: u32,
    /// Model presets it can create a model from.
    pub presets: RVec<RString>,
    /// Engine: a checkpoint update restarts it rather than reloading in place.
    pub restarts_on_checkpoint: bool,
    /// It reports weight digests (exported or served): what `[bridge] verify` compares.
    pub reports_digest: bool,
    /// Engine: `tandem serve` can put it behind HTTP (in process, one rank).
    pub serves: bool,
    /// Trainer: it can be a value model (a PPO critic with a scalar head).
    pub value_model: bool,
    /// Trainer: it implements the policy-loss variants.
    pub loss_variants: bool,
    /// Trainer: it implements `train_step_advantages` (a policy step with per-token
    /// advantages: the actor of PPO with a critic).
    pub token_advantages: bool,
}

/// One problem a plugin found in a component's options, reported by
/// [`PluginModule::validate_config`](crate::module::PluginModule) before anything starts (the
/// host turns it into a `job.toml:LINE:COL: engine.options.KEY: message (help: ...)` line).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigProblem {
    /// Dotted key path inside the component's options table, e.g. `max_batch` or
    /// `lora.targets[1]`; empty for the whole table.
    pub key: RString,
    /// What is wrong, one line.
    pub message: RString,
    /// How to fix it (may be empty).
    pub help: RString,
}

impl ConfigProblem {
    /// A problem at `key` (empty: the whole table) with no help text.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigProblem {
            key: RString::from(key.into()),
            message: RString::from(message.into()),
            help: RString::new(),
        }
    }

    /// Adds a help line.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = RString::from(help.into());
        self
    }

    /// The problem as a constructor error of `what` (e.g. ``engine `native` ``):
    /// `what options: key: message`, with the help line.
    pub fn to_error(&self, what: &str) -> crate::error::PluginError {
        crate::error::PluginError::invalid_input(format!("{what} options: {self}"))
            .with_help(self.help.as_str())
    }
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}
/// Severity of a plugin log line.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Very verbose.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal progress.
    Info,
    /// Something odd but recoverable.
    Warn,
    /// A failure.
    Error,
}
