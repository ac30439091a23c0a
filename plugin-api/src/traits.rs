//! The `#[sabi_trait]` role traits crossing the ABI, and the host-services handle.
//!
//! Plugins do not implement these directly: they implement the plain Rust traits of
//! [`crate::sdk`], whose adapters implement these with a panic guard around every call, so no
//! panic ever unwinds into `extern "C"` code. The host only ever sees the `*_TO` trait objects.
//!
//! Evolution is append-only: new methods go after the one marked `#[sabi(last_prefix_field)]`
//! and raise [`crate::API_LEVEL`].

// The sabi_trait macro generates items without docs and a non-local impl; both are generated
// code we do not control.
#![allow(missing_docs, non_local_definitions)]

use crate::error::PResult;
use crate::types::{
    CheckpointInfo, ComponentStats, EngineHealth, GenerateRequest, GenerateResponse, LogLevel,
    Metric, PauseMode, RegionInfo, RegionRequest, TrainBatch, TrainerInfo, UpdateKind,
    UpdateReport, WeightUpdate, WhichWeights,
};
// abi-append:hidden_states:begin
use crate::error::PluginError;
use crate::types::{FeatureBatch, HiddenStatesReport, HiddenStatesRequest};
// abi-append:hidden_states:end
// abi-append:bridge:begin
use crate::types::BridgePlan;
// abi-append:bridge:end
// abi-append:bridge_io:begin
use crate::types::{ApplyOutcome, Received, ResidentTags, Shipment, TensorBucket};
// abi-append:bridge_io:end
// abi-append:policy_loss:begin
use crate::types::{PolicyLoss, TokenAdvantages, ValueTargets};
// abi-append:policy_loss:end
use crate::types::{EnvItem, EnvironmentInfo, Reward, ScoreSample};
use abi_stable::sabi_trait;
use abi_stable::std_types::{RArc, RBox, RSlice, RSliceMut, RStr, RString, RVec};

/// An inference engine: generation, pause/flush/release, weight updates, adapters.
///
/// Methods take `&self`: an engine serves concurrent callers (the host pauses an engine from
/// one thread while another thread waits in `generate`), so implementations synchronise
/// internally.
#[sabi_trait]
pub trait InferenceEngine: Send + Sync {
    /// Brings the engine up (launch servers, allocate weights and KV cache).
    fn start(&self) -> PResult<()>;
    /// Reports readiness and the weight version served.
    fn health(&self) -> PResult<EngineHealth>;
    /// Stops the engine and frees everything it holds.
    fn shutdown(&self) -> PResult<()>;
    /// Completes a batch of token-id prompts.
    fn generate(&self, request: GenerateRequest) -> PResult<GenerateResponse>;
    /// Logprob of every token after the first of each sequence under the served weights.
    fn score(&self, sequences: RVec<RVec<u32>>) -> PResult<RVec<RVec<f32>>>;
    /// Stops taking new work; in-flight requests are handled per `mode`.
    fn pause_generation(&self, mode: PauseMode) -> PResult<()>;
    /// Resumes after `pause_generation`.
    fn continue_generation(&self) -> PResult<()>;
    /// Drops cached prefixes / KV entries (engine must be paused).
    fn flush_cache(&self) -> PResult<()>;
    /// Frees the memory of the given tags, keeping what is needed to resume.
    fn release_memory(&self, tags: RVec<RString>) -> PResult<()>;
    /// Brings back the memory of the given tags.
    fn resume_memory(&self, tags: RVec<RString>) -> PResult<()>;
    /// Applies a weight update of a declared kind.
    fn apply_weight_update(&self, update: WeightUpdate) -> PResult<UpdateReport>;
    /// Loads a PEFT LoRA adapter from `dir` under `name`.
    fn load_adapter(&self, name: RString, dir: RString) -> PResult<()>;
    /// Unloads the adapter loaded under `name`.
    fn unload_adapter(&self, name: RString) -> PResult<()>;
    /// Self-reported statistics.
    #[sabi(last_prefix_field)]
    fn stats(&self) -> PResult<ComponentStats>;
    // abi-append:hidden_states:begin (API level 3; app/tests/it/abi_versions.rs cuts it out)
    /// Computes the per-position features of `request.layers` for each sequence and sends
    /// them along `request.route` (API level [`HIDDEN`](crate::api_level::HIDDEN)). A plugin
    /// built before this method answers `NotSupported` (the default runs in its place).
    fn hidden_states(&self, request: HiddenStatesRequest) -> PResult<HiddenStatesReport> {
        let _ = request;
        Err(PluginError::not_supported("hidden_states", "this engine")).into()
    }
    /// Loads (or replaces) the draft model the engine speculates with, from a drafter
    /// directory, and speculates with it; on an error the engine keeps serving as it did. An
    /// empty `dir` turns speculation off (the engine may keep the drafter's buffers for the
    /// next load).
    fn load_drafter(&self, dir: RString) -> PResult<()> {
        let _ = dir;
        Err(PluginError::not_supported("load_drafter", "this engine")).into()
    }
    // abi-append:hidden_states:end
}

/// A trainer: logprobs, train steps, snapshots, checkpoints, weight export, offload.
#[sabi_trait]
pub trait Trainer: Send {
    /// Loads the model and optimizer; reports sizes and the weight version.
    fn init(&mut self) -> PResult<TrainerInfo>;
    /// Logprobs of each sequence's completion tokens under `which` weights.
    fn compute_logprobs(
        &mut self,
        batch: TrainBatch,
        which: WhichWeights,
    ) -> PResult<RVec<RVec<f32>>>;
    /// One optimiser step on `batch`; returns metrics such as `loss` and `grad_norm`.
    fn train_step(&mut self, batch: TrainBatch) -> PResult<RVec<Metric>>;
    /// Saves the current weights (and optimizer state) as a named snapshot.
    fn snapshot(&mut self, name: RString) -> PResult<()>;
    /// Makes a named snapshot the current weights.
    fn restore(&mut self, name: RString) -> PResult<()>;
    /// Writes a checkpoint into `dir`.
    fn save_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo>;
    /// Loads a checkpoint from `dir`.
    fn load_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo>;
    /// Produces a weight update of the given kind for the engine side.
    fn export_weight_update(&mut self, kind: UpdateKind) -> PResult<WeightUpdate>;
    /// Frees the memory of the given tags (kept resumable).
    fn offload(&mut self, tags: RVec<RString>) -> PResult<()>;
    /// Brings back the memory of the given tags.
    fn onload(&mut self, tags: RVec<RString>) -> PResult<()>;
    /// Self-reported statistics.
    #[sabi(last_prefix_field)]
    fn stats(&self) -> PResult<ComponentStats>;
    // abi-append:hidden_states:begin (API level 3; app/tests/it/abi_versions.rs cuts it out)
    /// One optimiser step on `batch` whose per-position features arrive as `features`
    /// describes (API level [`HIDDEN`](crate::api_level::HIDDEN)); e.g. a drafter trainer.
    fn train_step_features(
        &mut self,
        batch: TrainBatch,
        features: FeatureBatch,
    ) -> PResult<RVec<Metric>> {
        let _ = (batch, features);
        Err(PluginError::not_supported(
            "train_step_features",
            "this trainer",
        ))
        .into()
    }
    // abi-append:hidden_states:end
    // abi-append:policy_loss:begin (API level 5; app/tests/it/abi_versions.rs cuts it out)
    /// One optimiser step on `batch` minimising the policy-loss variant `loss` (API level
    /// [`PLAN`](crate::api_level::PLAN); the definitions are in
    /// `plugins/native/core/src/loss.rs`). With [`PolicyLoss::default`] it is exactly
    /// `train_step`. A trainer that implements it says so (`loss_variants` of its
    /// `describe_config`); one built before this method answers `NotSupported`.
    fn train_step_policy(&mut self, batch: TrainBatch, loss: PolicyLoss) -> PResult<RVec<Metric>> {
        let _ = (batch, loss);
        Err(PluginError::not_supported(
            "train_step_policy",
            "this trainer",
        ))
        .into()
    }
    /// One optimiser step of the policy loss `loss` with a per-token advantage (PPO with a
    /// critic; each sequence's `advantage` is ignored). A trainer that implements it says so
    /// with `loss_variants`; one that does not answers `NotSupported`.
    fn train_step_advantages(
        &mut self,
        batch: TrainBatch,
        loss: PolicyLoss,
        advantages: TokenAdvantages,
    ) -> PResult<RVec<Metric>> {
        let _ = (batch, loss, advantages);
        Err(PluginError::not_supported(
            "train_step_advantages",
            "this trainer",
        ))
        .into()
    }
    /// A value model's value of every completion token's state (see [`ValueTargets`]), one
    /// row per sequence. A trainer that can be a value model says so (`value_model` of its
    /// `describe_config`).
    fn compute_values(&mut self, batch: TrainBatch) -> PResult<RVec<RVec<f32>>> {
        let _ = batch;
        Err(PluginError::not_supported("compute_values", "this trainer")).into()
    }
    /// One optimiser step of a value model on the value loss of `targets` (learning rate and
    /// gradient clip from the batch's [`LossConfig`]); metrics `value_loss`, `value_clip_frac`,
    /// `grad_norm`.
    fn train_step_value(
        &mut self,
        batch: TrainBatch,
        targets: ValueTargets,
    ) -> PResult<RVec<Metric>> {
        let _ = (batch, targets);
        Err(PluginError::not_supported(
            "train_step_value",
            "this trainer",
        ))
        .into()
    }
    // abi-append:policy_loss:end
}

/// A weight bridge: the halves of a sync, each in the process it concerns.
///
/// The host constructs one instance in the controller (asked for its [`plan`]), one in the
/// trainer rank 0 worker and one in every engine worker. A sync is: the trainer exports the
/// bridge's first declared kind, `trainer_side` (trainer process) turns it into what travels
/// (an atomically written checkpoint, a region key, a bucket manifest); then, at once, `send`
/// (trainer process) moves the data over the bridge's transport group while each engine's
/// `engine_side` turns what arrived into what that engine's `apply_weight_update` takes, and
/// the engine applies it. The host compares every engine's report with the shipped update's
/// version and digest. See [`crate::types::BridgePlan`] for what the host does on a bridge's
/// behalf.
///
/// [`plan`]: WeightBridge::plan
#[sabi_trait]
pub trait WeightBridge: Send + Sync {
    /// Trainer-side half: runs in the trainer's process.
    fn trainer_side(&self, exported: WeightUpdate) -> PResult<WeightUpdate>;
    /// Engine-side half: runs in the engine's process.
    #[sabi(last_prefix_field)]
    fn engine_side(&self, shipped: WeightUpdate) -> PResult<WeightUpdate>;
    // abi-append:bridge:begin (API level 4; app/tests/it/abi_versions.rs cuts it out)
    /// What the bridge needs from the host given its options (API level
    /// [`BRIDGE`](crate::api_level::BRIDGE)); asked once, in the controller, before the run
    /// starts. A bridge built before this method is refused (the default answers
    /// `NotSupported`).
    fn plan(&self) -> PResult<BridgePlan> {
        Err(PluginError::not_supported("plan", "this bridge")).into()
    }
    /// Trainer process: moves the data of `shipped` (what `trainer_side` returned) to the
    /// engines over [`BRIDGE_GROUP`](crate::types::BRIDGE_GROUP), while each engine applies
    /// it. Runs only when the plan asks for a transport; the default moves nothing.
    fn send(&self, shipped: WeightUpdate) -> PResult<()> {
        let _ = shipped;
        Ok(()).into()
    }
    // abi-append:bridge:end
    // abi-append:bridge_io:begin (API level 7; app/tests/it/abi_versions cuts it out)
    /// Trainer process (API level [`BRIDGE_IO`](crate::api_level::BRIDGE_IO)): turns the
    /// trainer's export into what ships — a standard update, placed buckets, or a payload of
    /// the bridge's own. The host calls this, never `trainer_side`, on every bridge: for one
    /// built before this method the default wraps its `trainer_side`.
    fn ship(&self, exported: WeightUpdate) -> PResult<Shipment> {
        self.trainer_side(exported).map(Shipment::from_update)
    }
    /// Trainer process: moves the data of `shipment` (what `ship` returned) to the engines
    /// over [`BRIDGE_GROUP`](crate::types::BRIDGE_GROUP) while each engine's `receive` runs.
    /// Runs only when the plan asks for a transport. The default is a level-4 bridge's
    /// `send`.
    fn transmit(&self, shipment: Shipment) -> PResult<()> {
        match shipment.to_update() {
            Some(update) => self.send(update),
            None => Err(PluginError::not_supported(
                "transmit of a bridge-owned payload",
                "this bridge",
            ))
            .into(),
        }
    }
    /// Engine process: turns what arrived into what this engine takes — an update for its
    /// `apply_weight_update` ([`Received::Apply`]), or the decoded tensors handed to `sink`
    /// (`begin` with the buckets, then each bucket's bytes in order; [`Received::Decoded`]),
    /// which the host feeds to the engine's bucket path as they come: the engine copies
    /// them into the weights it serves and never serves the bridge's memory. The default is
    /// a level-4 bridge's `engine_side`.
    fn receive(&self, shipment: Shipment, sink: SinkBox) -> PResult<Received> {
        drop(sink);
        match shipment.to_update() {
            Some(update) => self.engine_side(update).map(Received::Apply),
            None => Err(PluginError::not_supported(
                "receive of a bridge-owned payload",
                "this bridge",
            ))
            .into(),
        }
    }
    /// How an apply ended: in an engine's process, this engine's apply of the shipment; in
    /// the trainer's, the whole sync (every engine applied and was verified). Called once per
    /// `receive` / per sync, success or not: a bridge reuses a buffer only after it. The
    /// default does nothing.
    fn after_apply(&self, outcome: ApplyOutcome) -> PResult<()> {
        let _ = outcome;
        Ok(()).into()
    }
    /// Tags each side keeps resident while the bridge is in use, asked once in the
    /// controller (the plan's `resident_tags` are ignored when this answers). The default:
    /// the plan's `resident_tags` on both sides.
    fn resident(&self) -> PResult<ResidentTags> {
        self.plan().map(|p| ResidentTags {
            trainer: p.resident_tags.clone(),
            engines: p.resident_tags,
        })
    }
    /// The bridge's own figures since the last call (e.g. wire bytes, compression ratio,
    /// seconds in a half), asked after every sync in each process holding a half; the host
    /// records them under `bridge.<name>` (trainer half) and `bridge.engines.<name>` (summed
    /// over the engines). The default has none.
    fn stats(&self) -> PResult<RVec<Metric>> {
        Ok(RVec::new()).into()
    }
    // abi-append:bridge_io:end
}

// abi-append:bridge_io:begin
/// Where a bridge's engine half puts decoded tensors (API level
/// [`BRIDGE_IO`](crate::api_level::BRIDGE_IO)): the host's, handed to
/// [`WeightBridge::receive`]. The host feeds what it gets to its engine's bucket path (the
/// way `TensorBuckets` are applied), holding at most two buckets: `put` returns once the
/// bytes are copied out.
#[sabi_trait]
pub trait TensorSink: Send {
    /// The buckets that follow, in order (tensor offsets relative to each bucket); once,
    /// before the first `put`.
    fn begin(&mut self, buckets: RVec<TensorBucket>) -> PResult<()>;
    /// The bytes of the next bucket (exactly its `bytes`).
    #[sabi(last_prefix_field)]
    fn put(&mut self, data: RSlice<'_, u8>) -> PResult<()>;
}

/// A sink as it crosses the ABI.
pub type SinkBox = TensorSink_TO<'static, RBox<()>>;
// abi-append:bridge_io:end

/// An environment: the problems a run trains and evaluates on, and their rewards (API level
/// [`ENVIRONMENT`](crate::api_level::ENVIRONMENT)). The host builds it in the controller;
/// an environment that runs user code (Python) runs it in processes of its own. The contract
/// is in [`crate::types::EnvItem`]'s module.
#[sabi_trait]
pub trait Environment: Send + Sync {
    /// Its splits, reward components and range.
    fn describe(&self) -> PResult<EnvironmentInfo>;
    /// Item `index` of `split` (the same for the same seed, split and index; past the end of
    /// a finite split, the next epoch's shuffle).
    fn item(&self, split: RString, index: u64) -> PResult<EnvItem>;
    /// One reward per sample, in order.
    #[sabi(last_prefix_field)]
    fn score(&self, samples: RVec<ScoreSample>) -> PResult<RVec<Reward>>;
}

/// Services the host hands to every plugin at construction.
///
/// Memory and transport calls return [`crate::ErrorCode::NotAvailable`] in a process where
/// the host has not set up a memory manager or a communicator (for example while a plugin is
/// only being listed); the error says so.
#[sabi_trait]
pub trait HostServices: Send + Sync + Clone {
    /// Writes a log line into the host's `tracing` output.
    fn log(&self, level: LogLevel, target: RStr<'_>, message: RStr<'_>);
    /// `true` once the host asked everything to stop.
    fn is_cancelled(&self) -> bool;
    /// Allocates a tagged region from this process's memory manager.
    fn alloc_region(&self, request: RegionRequest) -> PResult<RegionInfo>;
    /// Frees a region.
    fn free_region(&self, id: u64) -> PResult<()>;
    /// Maps a region another process shared under `key`.
    fn attach_region(&self, key: RString) -> PResult<RegionInfo>;
    /// Pauses every region with one of `tags` (memory freed, address kept).
    fn pause_tags(&self, tags: RVec<RString>) -> PResult<()>;
    /// Resumes every region with one of `tags`.
    fn resume_tags(&self, tags: RVec<RString>) -> PResult<()>;
    /// Copies every region with one of `tags` into a named snapshot.
    fn snapshot(&self, name: RString, tags: RVec<RString>) -> PResult<()>;
    /// Copies a named snapshot back into its regions.
    fn restore(&self, name: RString) -> PResult<()>;
    /// Drops a named snapshot.
    fn drop_snapshot(&self, name: RString) -> PResult<()>;
    /// Memory figures of this process (resident, paused, backup bytes by tag).
    fn memory_stats(&self) -> PResult<RVec<Metric>>;
    /// Sends `data` to rank `dst` of the named group.
    fn send(&self, group: RStr<'_>, dst: u32, data: RSlice<'_, u8>, tag: u64) -> PResult<()>;
    /// Receives into `buf` (exact size) from rank `src` of the named group.
    fn recv(&self, group: RStr<'_>, src: u32, buf: RSliceMut<'_, u8>, tag: u64) -> PResult<()>;
    /// Broadcasts `buf` from `root` to every rank of the named group.
    #[sabi(last_prefix_field)]
    fn broadcast(&self, group: RStr<'_>, root: u32, buf: RSliceMut<'_, u8>) -> PResult<()>;
}

/// An engine trait object as it crosses the ABI.
pub type EngineBox = InferenceEngine_TO<'static, RBox<()>>;
/// A trainer trait object as it crosses the ABI.
pub type TrainerBox = Trainer_TO<'static, RBox<()>>;
/// A bridge trait object as it crosses the ABI.
pub type BridgeBox = WeightBridge_TO<'static, RBox<()>>;
/// An environment trait object as it crosses the ABI.
pub type EnvironmentBox = Environment_TO<'static, RBox<()>>;
/// The host-services handle as it crosses the ABI (cheap to clone).
pub type HostBox = HostServices_TO<'static, RArc<()>>;
