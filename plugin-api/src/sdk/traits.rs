//! The plain Rust traits a plugin author implements: [`EngineImpl`], [`TrainerImpl`],
//! [`BridgeImpl`] (the components, with `Result` and owned types; what a component does not
//! implement answers `NotSupported`) and [`Plugin`] (the manifest, constructors and option
//! checks).

use super::Result;
use crate::caps::{ComponentKind, PluginManifest};
use crate::error::PluginError;
use crate::traits::{BridgeBox, EngineBox, EnvironmentBox, HostBox, TrainerBox};
#[cfg(doc)]
use crate::traits::{InferenceEngine, Trainer, WeightBridge};
use crate::types::*;
use abi_stable::std_types::RVec;

fn unsupported<T>(op: &str, component: &str) -> Result<T> {
    Err(PluginError::not_supported(op, component))
}

/// An inference engine, as a plugin author writes it. Unimplemented operations default to a
/// [`NotSupported`](crate::ErrorCode::NotSupported) error; declare what you implement in the
/// manifest.
#[allow(unused_variables)]
pub trait EngineImpl: Send + Sync + 'static {
    /// Component name, used in error messages.
    fn component(&self) -> &str;
    /// See [`InferenceEngine::start`].
    fn start(&self) -> Result<()> {
        Ok(())
    }
    /// See [`InferenceEngine::health`].
    fn health(&self) -> Result<EngineHealth>;
    /// See [`InferenceEngine::shutdown`].
    fn shutdown(&self) -> Result<()> {
        Ok(())
    }
    /// See [`InferenceEngine::generate`].
    fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        unsupported("generate", self.component())
    }
    /// See [`InferenceEngine::score`].
    fn score(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        unsupported("score", self.component())
    }
    /// See [`InferenceEngine::pause_generation`].
    fn pause_generation(&self, mode: PauseMode) -> Result<()> {
        unsupported("pause_generation", self.component())
    }
    /// See [`InferenceEngine::continue_generation`].
    fn continue_generation(&self) -> Result<()> {
        unsupported("continue_generation", self.component())
    }
    /// See [`InferenceEngine::flush_cache`].
    fn flush_cache(&self) -> Result<()> {
        unsupported("flush_cache", self.component())
    }
    /// See [`InferenceEngine::release_memory`].
    fn release_memory(&self, tags: Vec<String>) -> Result<()> {
        unsupported("release_memory", self.component())
    }
    /// See [`InferenceEngine::resume_memory`].
    fn resume_memory(&self, tags: Vec<String>) -> Result<()> {
        unsupported("resume_memory", self.component())
    }
    /// See [`InferenceEngine::apply_weight_update`].
    fn apply_weight_update(&self, update: WeightUpdate) -> Result<UpdateReport> {
        unsupported("apply_weight_update", self.component())
    }
    /// See [`InferenceEngine::load_adapter`].
    fn load_adapter(&self, name: String, dir: String) -> Result<()> {
        unsupported("load_adapter", self.component())
    }
    /// See [`InferenceEngine::unload_adapter`].
    fn unload_adapter(&self, name: String) -> Result<()> {
        unsupported("unload_adapter", self.component())
    }
    /// See [`InferenceEngine::stats`].
    fn stats(&self) -> Result<ComponentStats> {
        Ok(ComponentStats::default())
    }
    // abi-append:hidden_states:begin
    /// See [`InferenceEngine::hidden_states`].
    fn hidden_states(&self, request: HiddenStatesRequest) -> Result<HiddenStatesReport> {
        unsupported("hidden_states", self.component())
    }
    /// See [`InferenceEngine::load_drafter`].
    fn load_drafter(&self, dir: String) -> Result<()> {
        unsupported("load_drafter", self.component())
    }
    // abi-append:hidden_states:end
}

/// A trainer, as a plugin author writes it.
#[allow(unused_variables)]
pub trait TrainerImpl: Send + 'static {
    /// Component name, used in error messages.
    fn component(&self) -> &str;
    /// See [`Trainer::init`].
    fn init(&mut self) -> Result<TrainerInfo>;
    /// See [`Trainer::compute_logprobs`].
    fn compute_logprobs(
        &mut self,
        batch: TrainBatch,
        which: WhichWeights,
    ) -> Result<Vec<RVec<f32>>> {
        unsupported("compute_logprobs", self.component())
    }
    /// See [`Trainer::train_step`].
    fn train_step(&mut self, batch: TrainBatch) -> Result<Vec<Metric>> {
        unsupported("train_step", self.component())
    }
    /// See [`Trainer::snapshot`].
    fn snapshot(&mut self, name: String) -> Result<()> {
        unsupported("snapshot", self.component())
    }
    /// See [`Trainer::restore`].
    fn restore(&mut self, name: String) -> Result<()> {
        unsupported("restore", self.component())
    }
    /// See [`Trainer::save_checkpoint`].
    fn save_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        unsupported("save_checkpoint", self.component())
    }
    /// See [`Trainer::load_checkpoint`].
    fn load_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        unsupported("load_checkpoint", self.component())
    }
    /// See [`Trainer::export_weight_update`].
    fn export_weight_update(&mut self, kind: UpdateKind) -> Result<WeightUpdate> {
        unsupported("export_weight_update", self.component())
    }
    /// See [`Trainer::offload`].
    fn offload(&mut self, tags: Vec<String>) -> Result<()> {
        unsupported("offload", self.component())
    }
    /// See [`Trainer::onload`].
    fn onload(&mut self, tags: Vec<String>) -> Result<()> {
        unsupported("onload", self.component())
    }
    /// See [`Trainer::stats`].
    fn stats(&self) -> Result<ComponentStats> {
        Ok(ComponentStats::default())
    }
    // abi-append:hidden_states:begin
    /// See [`Trainer::train_step_features`].
    fn train_step_features(
        &mut self,
        batch: TrainBatch,
        features: FeatureBatch,
    ) -> Result<Vec<Metric>> {
        unsupported("train_step_features", self.component())
    }
    // abi-append:hidden_states:end
    // abi-append:policy_loss:begin
    /// See [`Trainer::train_step_policy`]. Implement it (and answer `loss_variants` in
    /// [`Plugin::describe_config`]) so that `train_step_policy(batch, PolicyLoss::default())`
    /// is `train_step(batch)` exactly.
    fn train_step_policy(&mut self, batch: TrainBatch, loss: PolicyLoss) -> Result<Vec<Metric>> {
        unsupported("train_step_policy", self.component())
    }
    /// See [`Trainer::train_step_advantages`].
    fn train_step_advantages(
        &mut self,
        batch: TrainBatch,
        loss: PolicyLoss,
        advantages: TokenAdvantages,
    ) -> Result<Vec<Metric>> {
        unsupported("train_step_advantages", self.component())
    }
    /// See [`Trainer::compute_values`]. Implement it and [`train_step_value`] (and answer
    /// `value_model` in [`Plugin::describe_config`]) for a trainer that can be a PPO critic.
    ///
    /// [`train_step_value`]: TrainerImpl::train_step_value
    fn compute_values(&mut self, batch: TrainBatch) -> Result<Vec<RVec<f32>>> {
        unsupported("compute_values", self.component())
    }
    /// See [`Trainer::train_step_value`].
    fn train_step_value(
        &mut self,
        batch: TrainBatch,
        targets: ValueTargets,
    ) -> Result<Vec<Metric>> {
        unsupported("train_step_value", self.component())
    }
    // abi-append:policy_loss:end
}

/// A weight bridge, as a plugin author writes it: the level-7 calls (`ship`, `transmit`,
/// `receive`, `after_apply`, `resident`, `stats`) or the level-4 ones (`trainer_side`,
/// `send`, `engine_side`), which the level-7 defaults adapt. What is implemented of neither
/// answers `NotSupported`.
#[allow(unused_variables)]
pub trait BridgeImpl: Send + Sync + 'static {
    /// See [`WeightBridge::trainer_side`]. A bridge that implements [`ship`](Self::ship)
    /// needs no `trainer_side`: the host calls `ship`.
    fn trainer_side(&self, exported: WeightUpdate) -> Result<WeightUpdate> {
        unsupported("trainer_side", "this bridge")
    }
    /// See [`WeightBridge::engine_side`]. A bridge that implements
    /// [`receive`](Self::receive) needs no `engine_side`: the host calls `receive`.
    fn engine_side(&self, shipped: WeightUpdate) -> Result<WeightUpdate> {
        unsupported("engine_side", "this bridge")
    }
    // abi-append:bridge:begin
    /// See [`WeightBridge::plan`]. The default: nothing resident, no restart, no transport.
    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan::default())
    }
    /// See [`WeightBridge::send`]. The default moves nothing.
    fn send(&self, shipped: WeightUpdate) -> Result<()> {
        Ok(())
    }
    // abi-append:bridge:end
    // abi-append:bridge_io:begin
    /// See [`WeightBridge::ship`]. The default wraps [`trainer_side`](Self::trainer_side).
    fn ship(&self, exported: WeightUpdate) -> Result<Shipment> {
        self.trainer_side(exported).map(Shipment::from_update)
    }
    /// See [`WeightBridge::transmit`]. The default is [`send`](Self::send) (a standard
    /// update only).
    fn transmit(&self, shipment: Shipment) -> Result<()> {
        match shipment.to_update() {
            Some(update) => self.send(update),
            None => unsupported("transmit of a bridge-owned payload", "this bridge"),
        }
    }
    /// See [`WeightBridge::receive`]. The default is [`engine_side`](Self::engine_side) (a
    /// standard update only).
    fn receive(&self, shipment: Shipment, sink: &mut super::Sink) -> Result<Received> {
        match shipment.to_update() {
            Some(update) => self.engine_side(update).map(Received::Apply),
            None => unsupported("receive of a bridge-owned payload", "this bridge"),
        }
    }
    /// See [`WeightBridge::after_apply`]. The default does nothing.
    fn after_apply(&self, outcome: ApplyOutcome) -> Result<()> {
        Ok(())
    }
    /// See [`WeightBridge::resident`]. The default: the plan's `resident_tags`, both sides.
    fn resident(&self) -> Result<ResidentTags> {
        let tags = self.plan()?.resident_tags;
        Ok(ResidentTags {
            trainer: tags.clone(),
            engines: tags,
        })
    }
    /// See [`WeightBridge::stats`]. The default has none.
    fn stats(&self) -> Result<Vec<Metric>> {
        Ok(Vec::new())
    }
    // abi-append:bridge_io:end
}

/// An environment, as a plugin author writes it (see [`crate::traits::Environment`] and the
/// contract in [`crate::types::EnvItem`]'s module).
pub trait EnvironmentImpl: Send + Sync + 'static {
    /// See [`crate::traits::Environment::describe`].
    fn describe(&self) -> Result<EnvironmentInfo>;
    /// See [`crate::traits::Environment::item`].
    fn item(&self, split: &str, index: u64) -> Result<EnvItem>;
    /// See [`crate::traits::Environment::score`].
    fn score(&self, samples: Vec<ScoreSample>) -> Result<Vec<Reward>>;
}

/// A plugin library: its manifest and constructors. Constructors that a plugin does not
/// provide default to a [`NotSupported`](crate::ErrorCode::NotSupported) error.
#[allow(unused_variables)]
pub trait Plugin: 'static {
    /// Name, version and components (see [`manifest`](super::manifest)).
    fn manifest() -> PluginManifest;
    /// Constructs the engine named by `config.component`.
    fn new_engine(config: ComponentConfig, host: HostBox) -> Result<EngineBox> {
        unsupported("new_engine", config.component.as_str())
    }
    /// Constructs the trainer named by `config.component`.
    fn new_trainer(config: ComponentConfig, host: HostBox) -> Result<TrainerBox> {
        unsupported("new_trainer", config.component.as_str())
    }
    /// Constructs the bridge named by `config.component`.
    fn new_bridge(config: ComponentConfig, host: HostBox) -> Result<BridgeBox> {
        unsupported("new_bridge", config.component.as_str())
    }
    /// Checks the options of the component `kind` named by `config.component` without
    /// constructing it: the constructor's own parse ([`parse_options`](super::parse_options)) plus static checks
    /// that need no resources (ranges, enum values, option combinations). Never start a
    /// process, open a model or look for an interpreter here. `tandem check` and `tandem run`
    /// call it before anything starts; the default finds no problems.
    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        Vec::new()
    }
    /// What the component `kind` named by `config.component` can do with its options (the
    /// update kinds a trainer exports with them, an engine's draft tokens and longest
    /// sequence, digests, serving): the same parse as the constructor, nothing started.
    /// `None` (the default): the plugin does not say, and the host goes by the manifest.
    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        None
    }
    /// The environment components of the plugin (none by default).
    fn environments() -> Vec<EnvironmentDecl> {
        Vec::new()
    }
    /// Constructs the environment named by `config.component` (see
    /// [`EnvironmentConfig::check_only`]: when set, start nothing).
    fn new_environment(config: EnvironmentConfig, host: HostBox) -> Result<EnvironmentBox> {
        unsupported("new_environment", config.component.as_str())
    }
}
