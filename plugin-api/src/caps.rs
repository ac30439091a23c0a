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
    /// `export_weight_update` produces. Bridge: the kind it asks the trainer to export, then
    /// (when it differs) the kind it hands each engine's `apply_weight_update`.
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
    /// Name used in job files (`[engine] plugin = "<name>"`, `[bridge] plugin = "<name>"`).
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
