//! Adapters from the plain traits to the ABI trait objects: every call runs under [`guard`]
//! and converts between owned Rust types and abi_stable's `R*` types.

use super::guard;
use super::traits::{BridgeImpl, EngineImpl, EnvironmentImpl, TrainerImpl};
use crate::error::PResult;
use crate::traits::{
    BridgeBox, EngineBox, Environment, Environment_TO, EnvironmentBox, InferenceEngine,
    InferenceEngine_TO, Trainer, Trainer_TO, TrainerBox, WeightBridge, WeightBridge_TO,
};
use crate::types::*;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RString, RVec};

fn strings(tags: RVec<RString>) -> Vec<String> {
    tags.into_iter().map(String::from).collect()
}

/// Adapter from an SDK trait implementation to the ABI trait, guarding every call.
struct Guarded<T>(T);

impl<E: EngineImpl> InferenceEngine for Guarded<E> {
    fn start(&self) -> PResult<()> {
        guard(|| self.0.start())
    }
    fn health(&self) -> PResult<EngineHealth> {
        guard(|| self.0.health())
    }
    fn shutdown(&self) -> PResult<()> {
        guard(|| self.0.shutdown())
    }
    fn generate(&self, request: GenerateRequest) -> PResult<GenerateResponse> {
        guard(|| self.0.generate(request))
    }
    fn score(&self, sequences: RVec<RVec<u32>>) -> PResult<RVec<RVec<f32>>> {
        guard(|| self.0.score(sequences.into_vec()).map(RVec::from))
    }
    fn pause_generation(&self, mode: PauseMode) -> PResult<()> {
        guard(|| self.0.pause_generation(mode))
    }
    fn continue_generation(&self) -> PResult<()> {
        guard(|| self.0.continue_generation())
    }
    fn flush_cache(&self) -> PResult<()> {
        guard(|| self.0.flush_cache())
    }
    fn release_memory(&self, tags: RVec<RString>) -> PResult<()> {
        guard(|| self.0.release_memory(strings(tags)))
    }
    fn resume_memory(&self, tags: RVec<RString>) -> PResult<()> {
        guard(|| self.0.resume_memory(strings(tags)))
    }
    fn apply_weight_update(&self, update: WeightUpdate) -> PResult<UpdateReport> {
        guard(|| self.0.apply_weight_update(update))
    }
    fn load_adapter(&self, name: RString, dir: RString) -> PResult<()> {
        guard(|| self.0.load_adapter(name.into(), dir.into()))
    }
    fn unload_adapter(&self, name: RString) -> PResult<()> {
        guard(|| self.0.unload_adapter(name.into()))
    }
    fn stats(&self) -> PResult<ComponentStats> {
        guard(|| self.0.stats())
    }
    // abi-append:hidden_states:begin
    fn hidden_states(&self, request: HiddenStatesRequest) -> PResult<HiddenStatesReport> {
        guard(|| self.0.hidden_states(request))
    }
    fn load_drafter(&self, dir: RString) -> PResult<()> {
        guard(|| self.0.load_drafter(dir.into()))
    }
    // abi-append:hidden_states:end
}

impl<T: TrainerImpl> Trainer for Guarded<T> {
    fn init(&mut self) -> PResult<TrainerInfo> {
        guard(|| self.0.init())
    }
    fn compute_logprobs(
        &mut self,
        batch: TrainBatch,
        which: WhichWeights,
    ) -> PResult<RVec<RVec<f32>>> {
        guard(|| self.0.compute_logprobs(batch, which).map(RVec::from))
    }
    fn train_step(&mut self, batch: TrainBatch) -> PResult<RVec<Metric>> {
        guard(|| self.0.train_step(batch).map(RVec::from))
    }
    fn snapshot(&mut self, name: RString) -> PResult<()> {
        guard(|| self.0.snapshot(name.into()))
    }
    fn restore(&mut self, name: RString) -> PResult<()> {
        guard(|| self.0.restore(name.into()))
    }
    fn save_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo> {
        guard(|| self.0.save_checkpoint(dir.into()))
    }
    fn load_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo> {
        guard(|| self.0.load_checkpoint(dir.into()))
    }
    fn export_weight_update(&mut self, kind: UpdateKind) -> PResult<WeightUpdate> {
        guard(|| self.0.export_weight_update(kind))
    }
    fn offload(&mut self, tags: RVec<RString>) -> PResult<()> {
        guard(|| self.0.offload(strings(tags)))
    }
    fn onload(&mut self, tags: RVec<RString>) -> PResult<()> {
        guard(|| self.0.onload(strings(tags)))
    }
    fn stats(&self) -> PResult<ComponentStats> {
        guard(|| self.0.stats())
    }
    // abi-append:hidden_states:begin
    fn train_step_features(
        &mut self,
        batch: TrainBatch,
        features: FeatureBatch,
    ) -> PResult<RVec<Metric>> {
        guard(|| self.0.train_step_features(batch, features).map(RVec::from))
    }
    // abi-append:hidden_states:end
    // abi-append:policy_loss:begin
    fn train_step_policy(&mut self, batch: TrainBatch, loss: PolicyLoss) -> PResult<RVec<Metric>> {
        guard(|| self.0.train_step_policy(batch, loss).map(RVec::from))
    }
    fn train_step_advantages(
        &mut self,
        batch: TrainBatch,
        loss: PolicyLoss,
        advantages: TokenAdvantages,
    ) -> PResult<RVec<Metric>> {
        guard(|| {
            self.0
                .train_step_advantages(batch, loss, advantages)
                .map(RVec::from)
        })
    }
    fn compute_values(&mut self, batch: TrainBatch) -> PResult<RVec<RVec<f32>>> {
        guard(|| self.0.compute_values(batch).map(RVec::from))
    }
    fn train_step_value(
        &mut self,
        batch: TrainBatch,
        targets: ValueTargets,
    ) -> PResult<RVec<Metric>> {
        guard(|| self.0.train_step_value(batch, targets).map(RVec::from))
    }
    // abi-append:policy_loss:end
}

impl<B: BridgeImpl> WeightBridge for Guarded<B> {
    fn trainer_side(&self, exported: WeightUpdate) -> PResult<WeightUpdate> {
        guard(|| self.0.trainer_side(exported))
    }
    fn engine_side(&self, shipped: WeightUpdate) -> PResult<WeightUpdate> {
        guard(|| self.0.engine_side(shipped))
    }
    // abi-append:bridge:begin
    fn plan(&self) -> PResult<BridgePlan> {
        guard(|| self.0.plan())
    }
    fn send(&self, shipped: WeightUpdate) -> PResult<()> {
        guard(|| self.0.send(shipped))
    }
    // abi-append:bridge:end
    // abi-append:bridge_io:begin
    fn ship(&self, exported: WeightUpdate) -> PResult<Shipment> {
        guard(|| self.0.ship(exported))
    }
    fn transmit(&self, shipment: Shipment) -> PResult<()> {
        guard(|| self.0.transmit(shipment))
    }
    fn receive(&self, shipment: Shipment, sink: crate::traits::SinkBox) -> PResult<Received> {
        guard(|| self.0.receive(shipment, &mut super::Sink::new(sink)))
    }
    fn after_apply(&self, outcome: ApplyOutcome) -> PResult<()> {
        guard(|| self.0.after_apply(outcome))
    }
    fn resident(&self) -> PResult<ResidentTags> {
        guard(|| self.0.resident())
    }
    fn stats(&self) -> PResult<RVec<Metric>> {
        guard(|| self.0.stats().map(RVec::from))
    }
    // abi-append:bridge_io:end
}

/// Wraps an engine for the ABI.
pub fn engine_box<E: EngineImpl>(engine: E) -> EngineBox {
    InferenceEngine_TO::from_value(Guarded(engine), TD_Opaque)
}

/// Wraps a trainer for the ABI.
pub fn trainer_box<T: TrainerImpl>(trainer: T) -> TrainerBox {
    Trainer_TO::from_value(Guarded(trainer), TD_Opaque)
}

/// Wraps a bridge for the ABI.
pub fn bridge_box<B: BridgeImpl>(bridge: B) -> BridgeBox {
    WeightBridge_TO::from_value(Guarded(bridge), TD_Opaque)
}

impl<V: EnvironmentImpl> Environment for Guarded<V> {
    fn describe(&self) -> PResult<EnvironmentInfo> {
        guard(|| self.0.describe())
    }
    fn item(&self, split: RString, index: u64) -> PResult<EnvItem> {
        guard(|| self.0.item(split.as_str(), index))
    }
    fn score(&self, samples: RVec<ScoreSample>) -> PResult<RVec<Reward>> {
        guard(|| self.0.score(samples.into_vec()).map(RVec::from))
    }
}

/// Wraps an environment for the ABI.
pub fn environment_box<V: EnvironmentImpl>(environment: V) -> EnvironmentBox {
    Environment_TO::from_value(Guarded(environment), TD_Opaque)
}
