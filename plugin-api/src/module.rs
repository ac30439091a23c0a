//! The root module every plugin library exports: an append-only prefix type of `extern "C"`
//! functions. Fields after the one marked `last_prefix_field` may be missing in older plugins
//! and are read as `Option`.

use crate::caps::PluginManifest;
use crate::error::PResult;
use crate::traits::{BridgeBox, EngineBox, HostBox, TrainerBox};
use crate::types::ComponentConfig;
use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};

/// The root module of a Tandem plugin library.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(option))]
pub struct PluginModule {
    /// Name, version, API level and components of the plugin.
    pub manifest: extern "C" fn() -> PResult<PluginManifest>,
    /// Constructs the engine component named in the config.
    pub new_engine: extern "C" fn(ComponentConfig, HostBox) -> PResult<EngineBox>,
    /// Constructs the trainer component named in the config.
    pub new_trainer: extern "C" fn(ComponentConfig, HostBox) -> PResult<TrainerBox>,
    /// Constructs the bridge component named in the config.
    #[sabi(last_prefix_field)]
    pub new_bridge: extern "C" fn(ComponentConfig, HostBox) -> PResult<BridgeBox>,
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "tandem_plugin";
    const NAME: &'static str = "tandem_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// A plugin linked statically into the host binary, registered with `inventory`.
///
/// `inventory` does not collect entries across a `dlopen`ed library (measured), so the host
/// merges these with dynamically loaded ones itself.
pub struct BuiltinPlugin {
    /// Returns the plugin's root module (same constructors as the cdylib build).
    pub root: fn() -> PluginModuleRef,
}

inventory::collect!(BuiltinPlugin);

/// Every built-in plugin linked into this binary.
pub fn builtin_plugins() -> impl Iterator<Item = &'static BuiltinPlugin> {
    inventory::iter::<BuiltinPlugin>.into_iter()
}
