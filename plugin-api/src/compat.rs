//! The role traits as API levels 2 to 4 declared them (before the appended hidden-state
//! methods, before the appended bridge methods, before the appended `train_step_policy`) and
//! the root modules of those levels (level 4: before `describe_config`), for the loader's
//! layout check of older plugins only.
//!
//! abi_stable refuses a library whose prefix types (root module, trait vtables) have *fewer*
//! fields than the host's, so a plugin built before a method was appended to a role trait
//! fails the check against the current traits. [`crate::module::init_root_module`] then
//! checks it against the root module of [`level4`], [`level3`], [`level2`] (constructors
//! returning these traits' objects) or [`crate::module::level1`], and reads it through the
//! current types: a trait object's vtable records its own method count, and an appended
//! method the library lacks runs the trait's default body (a `NotSupported` error) instead.
//!
//! Names and signatures here must stay exactly those of [`crate::traits`] minus the
//! appended methods: abi_stable compares type names and layouts, not module paths.

// Generated code (see `traits.rs`).
#![allow(missing_docs, non_local_definitions, clippy::too_many_arguments)]

/// The level-2 role traits and the root module whose constructors return them.
pub mod level2 {
    use crate::caps::{ComponentKind, PluginManifest};
    use crate::error::PResult;
    use crate::traits::HostBox;
    use crate::types::{
        CheckpointInfo, ComponentConfig, ComponentStats, ConfigProblem, EngineHealth,
        GenerateRequest, GenerateResponse, Metric, PauseMode, TrainBatch, TrainerInfo, UpdateKind,
        UpdateReport, WeightUpdate, WhichWeights,
    };
    use abi_stable::library::RootModule;
    use abi_stable::sabi_trait;
    use abi_stable::sabi_types::VersionStrings;
    use abi_stable::std_types::{RBox, RString, RVec};
    use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};

    /// [`crate::traits::InferenceEngine`] at API level 2.
    #[sabi_trait]
    pub trait InferenceEngine: Send + Sync {
        fn start(&self) -> PResult<()>;
        fn health(&self) -> PResult<EngineHealth>;
        fn shutdown(&self) -> PResult<()>;
        fn generate(&self, request: GenerateRequest) -> PResult<GenerateResponse>;
        fn score(&self, sequences: RVec<RVec<u32>>) -> PResult<RVec<RVec<f32>>>;
        fn pause_generation(&self, mode: PauseMode) -> PResult<()>;
        fn continue_generation(&self) -> PResult<()>;
        fn flush_cache(&self) -> PResult<()>;
        fn release_memory(&self, tags: RVec<RString>) -> PResult<()>;
        fn resume_memory(&self, tags: RVec<RString>) -> PResult<()>;
        fn apply_weight_update(&self, update: WeightUpdate) -> PResult<UpdateReport>;
        fn load_adapter(&self, name: RString, dir: RString) -> PResult<()>;
        fn unload_adapter(&self, name: RString) -> PResult<()>;
        #[sabi(last_prefix_field)]
        fn stats(&self) -> PResult<ComponentStats>;
    }

    /// [`crate::traits::Trainer`] at API level 2.
    #[sabi_trait]
    pub trait Trainer: Send {
        fn init(&mut self) -> PResult<TrainerInfo>;
        fn compute_logprobs(
            &mut self,
            batch: TrainBatch,
            which: WhichWeights,
        ) -> PResult<RVec<RVec<f32>>>;
        fn train_step(&mut self, batch: TrainBatch) -> PResult<RVec<Metric>>;
        fn snapshot(&mut self, name: RString) -> PResult<()>;
        fn restore(&mut self, name: RString) -> PResult<()>;
        fn save_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo>;
        fn load_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo>;
        fn export_weight_update(&mut self, kind: UpdateKind) -> PResult<WeightUpdate>;
        fn offload(&mut self, tags: RVec<RString>) -> PResult<()>;
        fn onload(&mut self, tags: RVec<RString>) -> PResult<()>;
        #[sabi(last_prefix_field)]
        fn stats(&self) -> PResult<ComponentStats>;
    }

    /// A level-2 engine object.
    pub type EngineBox = InferenceEngine_TO<'static, RBox<()>>;
    /// A level-2 trainer object.
    pub type TrainerBox = Trainer_TO<'static, RBox<()>>;

    /// [`crate::PluginModule`] at API level 2 (same name: abi_stable compares type names).
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
    #[sabi(missing_field(option))]
    pub struct PluginModule {
        pub manifest: extern "C" fn() -> PResult<PluginManifest>,
        pub new_engine: extern "C" fn(ComponentConfig, HostBox) -> PResult<EngineBox>,
        pub new_trainer: extern "C" fn(ComponentConfig, HostBox) -> PResult<TrainerBox>,
        #[sabi(last_prefix_field)]
        pub new_bridge:
            extern "C" fn(ComponentConfig, HostBox) -> PResult<super::level3::BridgeBox>,
        pub validate_config:
            extern "C" fn(ComponentKind, ComponentConfig) -> PResult<RVec<ConfigProblem>>,
    }

    impl RootModule for PluginModuleRef {
        declare_root_module_statics! {PluginModuleRef}
        const BASE_NAME: &'static str = "tandem_plugin";
        const NAME: &'static str = "tandem_plugin";
        const VERSION_STRINGS: VersionStrings = package_version_strings!();
    }
}

/// The level-3 bridge trait (engines and trainers are the current ones) and the root module
/// whose bridge constructor returns it.
pub mod level3 {
    use super::level4::TrainerBox;
    use crate::caps::{ComponentKind, PluginManifest};
    use crate::error::PResult;
    use crate::traits::{EngineBox, HostBox};
    use crate::types::{ComponentConfig, ConfigProblem, WeightUpdate};
    use abi_stable::library::RootModule;
    use abi_stable::sabi_trait;
    use abi_stable::sabi_types::VersionStrings;
    use abi_stable::std_types::{RBox, RVec};
    use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};

    /// [`crate::traits::WeightBridge`] at API levels 1 to 3.
    #[sabi_trait]
    pub trait WeightBridge: Send + Sync {
        fn trainer_side(&self, exported: WeightUpdate) -> PResult<WeightUpdate>;
        #[sabi(last_prefix_field)]
        fn engine_side(&self, shipped: WeightUpdate) -> PResult<WeightUpdate>;
    }

    /// A level-3 bridge object.
    pub type BridgeBox = WeightBridge_TO<'static, RBox<()>>;

    /// [`crate::PluginModule`] at API level 3 (same name: abi_stable compares type names).
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
    #[sabi(missing_field(option))]
    pub struct PluginModule {
        pub manifest: extern "C" fn() -> PResult<PluginManifest>,
        pub new_engine: extern "C" fn(ComponentConfig, HostBox) -> PResult<EngineBox>,
        pub new_trainer: extern "C" fn(ComponentConfig, HostBox) -> PResult<TrainerBox>,
        #[sabi(last_prefix_field)]
        pub new_bridge: extern "C" fn(ComponentConfig, HostBox) -> PResult<BridgeBox>,
        pub validate_config:
            extern "C" fn(ComponentKind, ComponentConfig) -> PResult<RVec<ConfigProblem>>,
    }

    impl RootModule for PluginModuleRef {
        declare_root_module_statics! {PluginModuleRef}
        const BASE_NAME: &'static str = "tandem_plugin";
        const NAME: &'static str = "tandem_plugin";
        const VERSION_STRINGS: VersionStrings = package_version_strings!();
    }
}

/// The trainer trait at API level 4 (engines and bridges are the current ones) and the root
/// module at API level 4, whose trainer constructor returns it: no `train_step_policy`, no
/// `describe_config`.
pub mod level4 {
    use crate::caps::{ComponentKind, PluginManifest};
    use crate::error::{PResult, PluginError};
    use crate::traits::{BridgeBox, EngineBox, HostBox};
    use crate::types::{
        CheckpointInfo, ComponentConfig, ComponentStats, ConfigProblem, FeatureBatch, Metric,
        TrainBatch, TrainerInfo, UpdateKind, WeightUpdate, WhichWeights,
    };
    use abi_stable::library::RootModule;
    use abi_stable::sabi_trait;
    use abi_stable::sabi_types::VersionStrings;
    use abi_stable::std_types::{RBox, RString, RVec};
    use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};

    /// [`crate::traits::Trainer`] at API levels 3 and 4.
    #[sabi_trait]
    pub trait Trainer: Send {
        fn init(&mut self) -> PResult<TrainerInfo>;
        fn compute_logprobs(
            &mut self,
            batch: TrainBatch,
            which: WhichWeights,
        ) -> PResult<RVec<RVec<f32>>>;
        fn train_step(&mut self, batch: TrainBatch) -> PResult<RVec<Metric>>;
        fn snapshot(&mut self, name: RString) -> PResult<()>;
        fn restore(&mut self, name: RString) -> PResult<()>;
        fn save_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo>;
        fn load_checkpoint(&mut self, dir: RString) -> PResult<CheckpointInfo>;
        fn export_weight_update(&mut self, kind: UpdateKind) -> PResult<WeightUpdate>;
        fn offload(&mut self, tags: RVec<RString>) -> PResult<()>;
        fn onload(&mut self, tags: RVec<RString>) -> PResult<()>;
        #[sabi(last_prefix_field)]
        fn stats(&self) -> PResult<ComponentStats>;
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
    }

    /// A level-4 trainer object.
    pub type TrainerBox = Trainer_TO<'static, RBox<()>>;

    /// [`crate::PluginModule`] at API level 4 (same name: abi_stable compares type names).
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
    #[sabi(missing_field(option))]
    pub struct PluginModule {
        pub manifest: extern "C" fn() -> PResult<PluginManifest>,
        pub new_engine: extern "C" fn(ComponentConfig, HostBox) -> PResult<EngineBox>,
        pub new_trainer: extern "C" fn(ComponentConfig, HostBox) -> PResult<TrainerBox>,
        #[sabi(last_prefix_field)]
        pub new_bridge: extern "C" fn(ComponentConfig, HostBox) -> PResult<BridgeBox>,
        pub validate_config:
            extern "C" fn(ComponentKind, ComponentConfig) -> PResult<RVec<ConfigProblem>>,
    }

    impl RootModule for PluginModuleRef {
        declare_root_module_statics! {PluginModuleRef}
        const BASE_NAME: &'static str = "tandem_plugin";
        const NAME: &'static str = "tandem_plugin";
        const VERSION_STRINGS: VersionStrings = package_version_strings!();
    }
}
