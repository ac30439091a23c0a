//! The role table: every engine and trainer method the controller calls in a worker, declared
//! once.
//!
//! [`role_table!`](crate::role_table) hands the table to a generator macro, which turns it
//! into code. Two generators read it:
//! - `tandem-control` (`protocol.rs`): the call enums ([`EngineCall`](crate::protocol::EngineCall),
//!   [`TrainerCall`](crate::protocol::TrainerCall): one variant per method, with `name()`,
//!   `quick()` and `dispatch(component)`, the worker's call of the ABI method) and the reply
//!   enums ([`EngineReply`](crate::protocol::EngineReply),
//!   [`TrainerReply`](crate::protocol::TrainerReply): one variant per method, its result);
//! - `tandem-runtime` (`role.rs`): the host traits `Engine` / `Trainer`, the `RemoteEngine` /
//!   `RemoteTrainer` methods and the in-process `Local<EngineBox>` / `Local<TrainerBox>`.
//!
//! # Rows
//!
//! ```text
//! /// Doc of the method.
//! Variant method(arg: Spec as Host, ...) -> Spec as Host [quick];
//! ```
//!
//! - `Spec` is what travels: the ABI type the method takes (returns) itself, which derives
//!   serde in `tandem-plugin-api`, except [`Rows<T>`](crate::packed::Rows) for an
//!   `RVec<RVec<T>>` that travels as packed blobs (converted with `From` both ways).
//! - `as Host` is what the host's handles take or return when it is not `Spec` itself
//!   (`&str` for `RString`, `&[String]` for tag lists, `Vec<Vec<u32>>` for `Rows<u32>`).
//! - `[quick]` marks a call answered from state (`health`, `stats`): it gets the short timeout;
//!   every other call gets the long one.
//!
//! Each role's header names its host trait (also the `Call`/`Reply` variant), the receiver of
//! the host trait's methods, the ABI box the worker calls and the generated type names.
//!
//! A module that expands the table imports its vocabulary: `use tandem_control::roles::vocabulary::*;`
//! (the table's names resolve where it is expanded).

/// Names the table's rows use.
pub mod vocabulary {
    pub use crate::packed::Rows;
    pub use tandem_plugin_api::{
        CheckpointInfo, ComponentStats, EngineBox, EngineHealth, FeatureBatch, GenerateRequest,
        GenerateResponse, HiddenStatesReport, HiddenStatesRequest, Metric, PauseMode, PolicyLoss,
        RString, RVec, TokenAdvantages, TrainBatch, TrainerBox, TrainerInfo, UpdateKind,
        UpdateReport, ValueTargets, WeightUpdate, WhichWeights,
    };
}

/// Expands `$generator! { <the role table> }`; see the [module docs](crate::roles).
#[macro_export]
macro_rules! role_table {
    ($generator:ident) => {
        $generator! {
            /// An inference engine: generation, scoring, pause and memory release, weight
            /// updates, adapters. Calls may run concurrently.
            Engine {
                receiver: &Self,
                abi: &EngineBox,
                call: EngineCall,
                reply: EngineReply,
                remote: RemoteEngine,
            } {
                /// Brings the engine up (servers, weights, KV cache).
                Start start() -> ();
                /// Readiness and the weight version served.
                Health health() -> EngineHealth [quick];
                /// Stops the engine and frees what it holds (the worker process keeps serving).
                Shutdown shutdown() -> ();
                /// Completes a batch of token-id prompts.
                Generate generate(request: GenerateRequest) -> GenerateResponse;
                /// Logprob of every token after the first of each sequence.
                Score score(sequences: Rows<u32> as Vec<Vec<u32>>) -> Rows<f32> as Vec<Vec<f32>>;
                /// Stops taking new work; in-flight requests are handled per `mode`.
                PauseGeneration pause_generation(mode: PauseMode) -> ();
                /// Resumes generation after a pause.
                ContinueGeneration continue_generation() -> ();
                /// Drops cached prefixes and KV entries (the engine must be paused).
                FlushCache flush_cache() -> ();
                /// Frees the memory of the given tags, keeping what is needed to resume.
                ReleaseMemory release_memory(tags: RVec<RString> as &[String]) -> ();
                /// Brings back the memory of the given tags.
                ResumeMemory resume_memory(tags: RVec<RString> as &[String]) -> ();
                /// Applies a weight update of a declared kind.
                ApplyWeightUpdate apply_weight_update(update: WeightUpdate) -> UpdateReport;
                /// Loads a PEFT LoRA adapter from `dir` under `name`.
                LoadAdapter load_adapter(name: RString as &str, dir: RString as &str) -> ();
                /// Unloads the adapter loaded under `name`.
                UnloadAdapter unload_adapter(name: RString as &str) -> ();
                /// Self-reported statistics.
                Stats stats() -> ComponentStats [quick];
                /// Per-position features of the requested layers, sent along the request's
                /// route (API level 3).
                HiddenStates hidden_states(request: HiddenStatesRequest) -> HiddenStatesReport;
                /// Loads or replaces the drafter the engine speculates with (API level 3).
                LoadDrafter load_drafter(dir: RString as &str) -> ();
            }
            /// A trainer: logprobs, train steps, snapshots, checkpoints, weight export,
            /// offload. Calls run one at a time, in order.
            Trainer {
                receiver: &mut Self,
                abi: &mut TrainerBox,
                call: TrainerCall,
                reply: TrainerReply,
                remote: RemoteTrainer,
            } {
                /// Loads the model and optimizer; reports sizes and the weight version.
                Init init() -> TrainerInfo;
                /// Logprobs of each sequence's completion tokens under `which` weights.
                ComputeLogprobs compute_logprobs(batch: TrainBatch, which: WhichWeights)
                    -> Rows<f32> as Vec<Vec<f32>>;
                /// One optimiser step on `batch`; returns metrics such as `loss`.
                TrainStep train_step(batch: TrainBatch) -> RVec<Metric> as Vec<Metric>;
                /// Saves the current weights (and optimizer state) as a named snapshot.
                Snapshot snapshot(name: RString as &str) -> ();
                /// Makes a named snapshot the current weights.
                Restore restore(name: RString as &str) -> ();
                /// Writes a checkpoint into `dir`.
                SaveCheckpoint save_checkpoint(dir: RString as &str) -> CheckpointInfo;
                /// Loads a checkpoint from `dir`.
                LoadCheckpoint load_checkpoint(dir: RString as &str) -> CheckpointInfo;
                /// Produces a weight update of the given kind for the engine side.
                ExportWeightUpdate export_weight_update(kind: UpdateKind) -> WeightUpdate;
                /// Frees the memory of the given tags (kept resumable).
                Offload offload(tags: RVec<RString> as &[String]) -> ();
                /// Brings back the memory of the given tags.
                Onload onload(tags: RVec<RString> as &[String]) -> ();
                /// Self-reported statistics.
                Stats stats() -> ComponentStats [quick];
                /// One optimiser step on `batch` with its features arriving as `features`
                /// says (API level 3).
                TrainStepFeatures train_step_features(batch: TrainBatch, features: FeatureBatch)
                    -> RVec<Metric> as Vec<Metric>;
                /// One optimiser step on `batch` minimising the policy-loss variant `loss`
                /// (API level 5; `PolicyLoss::default()` is `train_step`).
                TrainStepPolicy train_step_policy(batch: TrainBatch, loss: PolicyLoss)
                    -> RVec<Metric> as Vec<Metric>;
                /// One policy step with per-token advantages (API level 5; PPO).
                TrainStepAdvantages train_step_advantages(
                    batch: TrainBatch,
                    loss: PolicyLoss,
                    advantages: TokenAdvantages,
                ) -> RVec<Metric> as Vec<Metric>;
                /// A value model's value of every completion token's state (API level 5).
                ComputeValues compute_values(batch: TrainBatch) -> Rows<f32> as Vec<Vec<f32>>;
                /// One value-model step on `targets` (API level 5).
                TrainStepValue train_step_value(batch: TrainBatch, targets: ValueTargets)
                    -> RVec<Metric> as Vec<Metric>;
            }
        }
    };
}
