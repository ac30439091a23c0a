//! `tandem-plugin-api`: the stable ABI between the Tandem host and its plugins.
//!
//! This is the **only** crate shared by the host and plugins; its crate version is the ABI
//! version that abi_stable checks at load time, and [`API_LEVEL`] is a second, finer version
//! with named capability thresholds (the rust-analyzer proc-macro convention).
//!
//! Layers, from the wire up:
//! - [`error`]: the error record `{code, message, help}` every call returns on failure.
//! - [`types`]: FFI-safe data (token batches, sampling params, results, weight updates, stats);
//!   the data that travels between host processes also derives serde, its numeric vectors
//!   through [`wire`] (byte blobs).
//! - [`caps`]: what a plugin declares about its components before anything runs.
//! - [`traits`]: the `#[sabi_trait]` role traits and the [`traits::HostServices`] handle.
//! - [`module`]: the append-only root module every plugin library exports.
//! - [`lifecycle`]: the engine state machine (which lifecycle call is legal when), shared by
//!   the host, engine plugins and the conformance suite.
//! - [`files`]: the run-directory file contract (state file, versions, weights digest), pure
//!   Rust beside the ABI.
//! - [`sdk`]: what plugin authors write against: plain Rust traits, the panic guard, and
//!   [`export_plugin!`].
//!
//! No `String`, `Vec`, `Result`, `dyn`, tokio or cudarc type crosses the boundary: only the
//! `R*` types of abi_stable and `#[repr(C)]`/`#[repr(u8)]` types deriving `StableAbi`.

pub mod caps;
pub mod compat;
pub mod error;
pub mod files;
pub mod lifecycle;
pub mod module;
pub mod sdk;
pub mod traits;
pub mod types;
pub mod wire;

pub use abi_stable;
pub use abi_stable::std_types::{ROption, RResult, RSlice, RSliceMut, RStr, RString, RVec};
pub use caps::{Capabilities, ComponentDecl, ComponentKind, PluginManifest};
pub use error::{ErrorCode, PResult, PluginError};
pub use inventory;
pub use module::{PluginModule, PluginModuleRef};
/// Re-exported so an out-of-tree plugin can derive its options' `Deserialize` with
/// `#[serde(crate = "tandem_plugin_api::serde")]` and depend on this crate only.
pub use serde;
pub use traits::{BridgeBox, EngineBox, EnvironmentBox, HostBox, TrainerBox};
// abi-append:bridge_io:begin (cut out with the trait by the ABI tests)
pub use traits::SinkBox;
// abi-append:bridge_io:end
pub use types::*;

/// API level of this build of the crate. Raised (never lowered) whenever the ABI gains a
/// capability; a host checks `plugin.api_level >= MIN_API_LEVEL` and gates newer features on
/// the named thresholds below.
pub const API_LEVEL: u32 = api_level::BRIDGE_IO;

/// Oldest plugin API level this host build still drives.
pub const MIN_API_LEVEL: u32 = api_level::BASE;

/// Named API-level thresholds.
pub mod api_level {
    /// Engines, trainers, bridges, host services (logging, cancellation, memory, transport).
    pub const BASE: u32 = 1;
    /// The root module's `validate_config`: a plugin checks its components' options before
    /// anything starts (`tandem check`). Plugins below this level are not asked.
    pub const VALIDATE: u32 = 2;
    /// `InferenceEngine::hidden_states` / `load_drafter` and `Trainer::train_step_features`:
    /// hidden states over the data plane and speculative decoding with a trained drafter.
    /// Plugins below this level answer `NotSupported` to them.
    pub const HIDDEN: u32 = 3;
    /// `WeightBridge::plan` / `send`: bridges are components a job chooses (`[bridge] plugin`),
    /// with halves in the trainer's and the engines' processes. A bridge below this level is
    /// refused; engines and trainers below it are unaffected.
    pub const BRIDGE: u32 = 4;
    /// The root module's `describe_config`: what a component can do *with the options a job
    /// gives it* (the update kinds a trainer exports with or without LoRA, an engine's draft
    /// tokens and longest sequence, digests, whether it serves). Plugins below this level
    /// are described by their manifest. Also `Trainer::train_step_policy`: a step with a
    /// policy-loss variant ([`crate::types::PolicyLoss`]), and PPO's calls:
    /// `train_step_advantages` (per-token advantages), `compute_values` and
    /// `train_step_value` (a value model); trainers below this level answer `NotSupported`
    /// to them.
    pub const PLAN: u32 = 5;
    /// The root module's `environments` and `new_environment`: environments (the problems a
    /// run trains on and their rewards) are components a job chooses (`[environment]
    /// plugin`). Plugins below this level provide none.
    pub const ENVIRONMENT: u32 = 6;
    /// `WeightBridge::ship` / `transmit` / `receive` / `after_apply` / `resident` / `stats`:
    /// a bridge ships a payload of its own ([`crate::ShipmentBody::Owned`]) or placed buckets,
    /// hands its engine decoded tensors through a [`crate::traits::TensorSink`], keeps tags
    /// resident per side, learns how each apply ended and reports its own figures. A bridge
    /// below this level runs through its level-4 methods (the defaults adapt them).
    pub const BRIDGE_IO: u32 = 7;
}

/// Version of this crate, i.e. the ABI version a plugin was built against.
pub const ABI_VERSION: &str = env!("CARGO_PKG_VERSION");
