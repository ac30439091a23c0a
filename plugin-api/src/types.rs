//! FFI-safe data types carried by the role traits.
//!
//! Everything here is `#[repr(C)]` (structs) or `#[repr(u8)]` (enums) and derives `StableAbi`,
//! so abi_stable checks its layout when a plugin is loaded.

use abi_stable::StableAbi;
use abi_stable::std_types::{ROption, RString, RVec};

/// Well-known memory tags. Custom tags are any other non-empty string.
pub mod tags {
    /// Model parameters.
    pub const WEIGHTS: &str = "weights";
    /// Attention key/value cache of an engine.
    pub const KV_CACHE: &str = "kv_cache";
    /// Optimizer state (e.g. AdamW moments).
    pub const OPTIMIZER: &str = "optimizer";
    /// Gradients.
    pub const GRADS: &str = "grads";
    /// Activations kept for the backward pass.
    pub const ACTIVATIONS: &str = "activations";
    /// Speculative-decoding drafter weights and state.
    pub const DRAFTER: &str = "drafter";
    /// All well-known tags, in the order the host reports them.
    pub const ALL: [&str; 6] = [WEIGHTS, KV_CACHE, OPTIMIZER, GRADS, ACTIVATIONS, DRAFTER];
}

/// Element type of a tensor or region.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit brain float.
    BF16,
    /// 16-bit IEEE float.
    F16,
    /// Unsigned bytes (opaque data).
    U8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }
}

/// Sampling parameters for one generation request.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0.0` means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass in `(0, 1]`; `1.0` disables it.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables it.
    pub top_k: u32,
    /// Maximum number of new tokens per prompt.
    pub max_tokens: u32,
    /// Generation of a prompt stops after any of these tokens.
    pub stop_token_ids: RVec<u32>,
    /// Seed for reproducible sampling; `None` lets the engine choose.
    pub seed: ROption<u64>,
    /// Return the logprob of every generated token.
    pub logprobs: bool,
    /// Return the last layer's hidden state of every generated token.
    pub return_hidden_states: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 16,
            stop_token_ids: RVec::new(),
            seed: ROption::RNone,
            logprobs: true,
            return_hidden_states: false,
        }
    }
}

/// A batch of token-id prompts to complete with one set of sampling parameters.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// Prompt token ids, one list per sequence.
    pub prompts: RVec<RVec<u32>>,
    /// Sampling parameters shared by the batch.
    pub sampling: SamplingParams,
    /// LoRA adapter to generate with (by loaded name); `None` uses the base weights.
    pub adapter: ROption<RString>,
}

/// Why a sequence stopped.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Reached `max_tokens`.
    Length,
    /// Produced a stop token (included in `tokens`).
    Stop,
    /// Aborted by `pause_generation(Abort)` or shutdown.
    Aborted,
}

/// One completed sequence.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated token ids (prompt excluded).
    pub tokens: RVec<u32>,
    /// Logprob of each generated token under the sampling distribution before
    /// temperature/top-p/top-k (empty unless requested).
    pub logprobs: RVec<f32>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Row-major `[tokens.len(), hidden_dim]` last-layer hidden states (empty unless requested).
    pub hidden_states: RVec<f32>,
    /// Width of a hidden-state row (0 when none were returned).
    pub hidden_dim: u32,
}

/// The engine's answer to a [`GenerateRequest`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct GenerateResponse {
    /// One completion per prompt, in request order.
    pub completions: RVec<Completion>,
    /// Weight version that produced these tokens.
    pub weight_version: u64,
}

/// How `pause_generation` treats requests in flight.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Abort in-flight requests; they return with [`FinishReason::Aborted`].
    Abort,
    /// Wait for in-flight requests to finish, then pause.
    Wait,
    /// Freeze in-flight requests in place; they continue after `continue_generation`.
    Keep,
}

impl PauseMode {
    /// Lower-case name used in job files and output.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Abort => "abort",
            PauseMode::Wait => "wait",
            PauseMode::Keep => "keep",
        }
    }
}

/// Engine health as reported by `health`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct EngineHealth {
    /// Ready to accept generation requests.
    pub ready: bool,
    /// Weight version currently served.
    pub weight_version: u64,
    /// Free-form detail (server URL, state), for humans.
    pub detail: RString,
}

/// A named scalar metric.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
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
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct ComponentStats {
    /// Weight version currently held.
    pub weight_version: u64,
    /// Free-form state name, e.g. `serving`, `paused`.
    pub state: RString,
    /// Scalar figures.
    pub metrics: RVec<Metric>,
}

/// One sequence of a training batch: prompt + completion tokens and their RL signals.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TrainSequence {
    /// Prompt followed by completion token ids.
    pub tokens: RVec<u32>,
    /// Number of prompt tokens at the start of `tokens`; loss covers only the rest.
    pub prompt_len: u32,
    /// Sequence-level advantage (GRPO) or `0.0` for SFT.
    pub advantage: f32,
    /// Logprobs of the completion tokens under the policy that sampled them (may be empty).
    pub old_logprobs: RVec<f32>,
    /// Logprobs of the completion tokens under the reference policy (empty: no KL term).
    pub ref_logprobs: RVec<f32>,
}

/// Which loss `train_step` minimises.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossKind {
    /// PPO-clip policy loss with group-relative advantages and optional KL to the reference.
    Grpo,
    /// Plain cross-entropy on the completion tokens (warm starts).
    Sft,
}

/// Loss and optimiser settings of one train step.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct LossConfig {
    /// Which loss.
    pub kind: LossKind,
    /// Lower PPO clip range (ratio ≥ 1 − eps_low).
    pub clip_eps_low: f32,
    /// Upper PPO clip range (ratio ≤ 1 + eps_high).
    pub clip_eps_high: f32,
    /// Weight of the KL penalty to the reference policy (0 disables it).
    pub kl_coef: f32,
    /// Learning rate of this step.
    pub learning_rate: f32,
    /// Global gradient-norm clip (0 disables it).
    pub grad_clip: f32,
}

/// A batch for `compute_logprobs` / `train_step`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TrainBatch {
    /// Sequences of the batch.
    pub sequences: RVec<TrainSequence>,
    /// Loss settings (ignored by `compute_logprobs`).
    pub loss: LossConfig,
}

/// Which weights `compute_logprobs` uses.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub enum WhichWeights {
    /// The weights currently loaded (the actor, normally).
    Current,
    /// A named snapshot (e.g. `ref`), without disturbing the current weights.
    Snapshot(RString),
}

/// What a trainer reports after `init`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TrainerInfo {
    /// Number of trainable parameters.
    pub trainable_params: u64,
    /// Total number of parameters.
    pub total_params: u64,
    /// Weight version of the loaded weights.
    pub weight_version: u64,
}

/// Checkpoint written or read by a trainer.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct CheckpointInfo {
    /// Directory of the checkpoint.
    pub dir: RString,
    /// Weight version stored in it.
    pub weight_version: u64,
    /// Bytes written or read.
    pub bytes: u64,
}

/// Kinds of weight update a trainer can export and an engine can apply.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpdateKind {
    /// Weights in a shared memory region the engine maps (single copy).
    SharedRegion,
    /// A PEFT LoRA adapter.
    Adapter,
    /// A Hugging Face checkpoint directory.
    CheckpointDir,
    /// Bucketed tensors sent over the transport.
    TensorBuckets,
}

impl UpdateKind {
    /// Lower-case name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateKind::SharedRegion => "shared_region",
            UpdateKind::Adapter => "adapter",
            UpdateKind::CheckpointDir => "checkpoint_dir",
            UpdateKind::TensorBuckets => "tensor_buckets",
        }
    }
}

/// Placement of one tensor inside a region or bucket.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Hugging Face parameter name.
    pub name: RString,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: RVec<u64>,
    /// Byte offset from the start of the region or bucket.
    pub offset: u64,
}

/// Reference to a shareable memory region owned by another process.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct SharedRegionRef {
    /// Host-assigned key of the region (resolved through host services).
    pub key: RString,
    /// Device the region lives on (`cpu`, `cuda:0`).
    pub device: RString,
    /// Length in bytes.
    pub len: u64,
}

/// A group of tensors sent together over the transport.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TensorBucket {
    /// Tensors, with offsets relative to the bucket.
    pub tensors: RVec<TensorSpec>,
    /// Total bucket size in bytes.
    pub bytes: u64,
}

/// Where the new weights of an update are.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub enum UpdatePayload {
    /// Single copy: the engine maps this region and reads the tensors in place.
    SharedRegion {
        /// The region.
        region: SharedRegionRef,
        /// Tensor layout inside it. May be empty in a later update of a region whose layout
        /// an earlier update carried (it cannot change); the host then adds it back for an
        /// engine that has not attached the region.
        tensors: RVec<TensorSpec>,
    },
    /// A PEFT adapter directory to load under `name`.
    Adapter {
        /// Versioned adapter name to load it under.
        name: RString,
        /// Directory holding `adapter_config.json` + `adapter_model.safetensors`.
        dir: RString,
    },
    /// A complete Hugging Face checkpoint directory.
    CheckpointDir {
        /// The directory.
        dir: RString,
    },
    /// Tensors arriving over the transport on a named group.
    TensorBuckets {
        /// Transport group the buckets arrive on.
        group: RString,
        /// The buckets, in send order.
        buckets: RVec<TensorBucket>,
    },
}

impl UpdatePayload {
    /// The kind of this payload.
    pub fn kind(&self) -> UpdateKind {
        match self {
            UpdatePayload::SharedRegion { .. } => UpdateKind::SharedRegion,
            UpdatePayload::Adapter { .. } => UpdateKind::Adapter,
            UpdatePayload::CheckpointDir { .. } => UpdateKind::CheckpointDir,
            UpdatePayload::TensorBuckets { .. } => UpdateKind::TensorBuckets,
        }
    }
}

/// A weight update: the new weights' location plus version and digest.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct WeightUpdate {
    /// Weight version; only ever goes up.
    pub version: u64,
    /// Where the weights are.
    pub payload: UpdatePayload,
    /// Hex digest of the weights as the producer sees them (empty: not computed).
    pub digest: RString,
}

/// What an engine reports after applying an update.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct UpdateReport {
    /// Version now served.
    pub version: u64,
    /// Hex digest of the weights the engine now serves (empty: not computed).
    pub digest: RString,
    /// Bytes the engine copied to apply the update.
    pub bytes_copied: u64,
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

/// Request for a tagged memory region from the host.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct RegionRequest {
    /// Memory tag (see [`tags`]).
    pub tag: RString,
    /// Region name, unique within the process (for logs and sharing).
    pub name: RString,
    /// Size in bytes.
    pub bytes: u64,
    /// Element type of the contents.
    pub dtype: DType,
    /// Keep a CPU copy across a pause (`true`), or come back zeroed (`false`).
    pub backup: bool,
}

/// A region granted by the host: the plugin may compute on `[addr, addr + len)` while it is
/// resident. The address stays valid across pause/resume.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct RegionInfo {
    /// Host-assigned id.
    pub id: u64,
    /// Key under which the region can be shared with another process.
    pub key: RString,
    /// Start address in this process.
    pub addr: usize,
    /// Length in bytes.
    pub len: u64,
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
