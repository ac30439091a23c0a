//! What a plugin declares about itself before anything runs: its manifest, its components and
//! their capabilities. Capabilities are declared, never discovered by failure: `tandem check`
//! matches a job's bridge against them before a single process starts.

use crate::types::{PauseMode, UpdateKind};
use abi_stable::StableAbi;
use abi_stable::std_types::{RString, RVec};

/// Role of a component.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComponentKind {
    /// An inference engine.
    Engine,
    /// A trainer.
    Trainer,
    /// A weight bridge.
    Bridge,
}

impl ComponentKind {
    /// Lower-case name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentKind::Engine => "engine",
            ComponentKind::Trainer => "trainer",
            ComponentKind::Bridge => "bridge",
        }
    }
}

/// Declared capabilities of a component.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct Capabilities {
    /// Engine: update kinds `apply_weight_update` accepts. Trainer: kinds
    /// `export_weight_update` produces. Bridge: the kind both of its halves carry.
    pub update_kinds: RVec<UpdateKind>,
    /// Memory tags whose release really returns memory on this platform.
    pub releasable_tags: RVec<RString>,
    /// Pause modes the engine implements.
    pub pause_modes: RVec<PauseMode>,
    /// Engine: can return hidden states (generation's last layer; at API level 3 also
    /// `hidden_states`, any layers, over the transport). Trainer: steps on hidden states
    /// (`train_step_features`, e.g. a drafter trainer).
    pub hidden_states: bool,
    /// Engine: can load LoRA adapters. Trainer: can train LoRA adapters.
    pub lora: bool,
    /// Capabilities that exist but need a GPU (listed, never claimed on CPU).
    pub needs_gpu: RVec<RString>,
    /// Free-form notes for humans (platform caveats).
    pub notes: RVec<RString>,
}

/// One component a plugin library provides.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ComponentDecl {
    /// Role.
    pub kind: ComponentKind,
    /// Name used in job files (`[engine] plugin = "<name>"`, `[bridge] mode = "<name>"`).
    pub name: RString,
    /// One-line description.
    pub description: RString,
    /// Declared capabilities.
    pub caps: Capabilities,
}

/// Everything a plugin says about itself.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PluginManifest {
    /// Plugin name; unique among loaded plugins.
    pub name: RString,
    /// Plugin's own version (semver).
    pub version: RString,
    /// [`crate::API_LEVEL`] the plugin was built with.
    pub api_level: u32,
    /// Version of `tandem-plugin-api` the plugin was built against.
    pub abi_version: RString,
    /// Components it provides.
    pub components: RVec<ComponentDecl>,
}

/// Weight-bridge modes a job file can choose (`[bridge] mode`).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BridgeMode {
    /// Single copy through a shared region.
    Ipc,
    /// LoRA adapter hot swap.
    Lora,
    /// Checkpoint + engine restart/reload.
    Checkpoint,
    /// Bucketed tensors over the transport.
    Broadcast,
}

impl BridgeMode {
    /// All modes, in documentation order.
    pub const ALL: [BridgeMode; 4] = [
        BridgeMode::Ipc,
        BridgeMode::Lora,
        BridgeMode::Checkpoint,
        BridgeMode::Broadcast,
    ];

    /// The name used in job files.
    pub fn as_str(self) -> &'static str {
        match self {
            BridgeMode::Ipc => "ipc",
            BridgeMode::Lora => "lora",
            BridgeMode::Checkpoint => "checkpoint",
            BridgeMode::Broadcast => "broadcast",
        }
    }

    /// Parses a job-file name.
    pub fn parse(name: &str) -> Option<BridgeMode> {
        BridgeMode::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// The update kind this mode carries: the trainer must export it and the engine accept it.
    pub fn update_kind(self) -> UpdateKind {
        match self {
            BridgeMode::Ipc => UpdateKind::SharedRegion,
            BridgeMode::Lora => UpdateKind::Adapter,
            BridgeMode::Checkpoint => UpdateKind::CheckpointDir,
            BridgeMode::Broadcast => UpdateKind::TensorBuckets,
        }
    }
}
