//! The root module every plugin library exports: an append-only prefix type of `extern "C"`
//! functions. Fields after the one marked `last_prefix_field` may be missing in older plugins
//! and are read as `Option`; each is tied to the API level that introduced it (see
//! [`crate::api_level`]).

use crate::caps::ComponentKind;
use crate::caps::PluginManifest;
use crate::error::PResult;
use crate::traits::{BridgeBox, EngineBox, HostBox, TrainerBox};
use crate::types::{ComponentConfig, ConfigProblem};
// abi-append:describe_config:begin
use crate::types::ConfigCaps;
use abi_stable::std_types::ROption;
// abi-append:describe_config:end
// abi-append:environment:begin
use crate::traits::EnvironmentBox;
use crate::types::{EnvironmentConfig, EnvironmentDecl};
// abi-append:environment:end
use abi_stable::library::{LibHeader, LibraryError, RootModule, RootModuleError};
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::RVec;
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
    // --- appended fields: read as `Option` (absent in plugins built before them) ---
    // abi-append:validate_config:begin (API level 2; host/tests/abi_versions.rs cuts it out)
    /// Checks the options of the component named in the config without constructing it or
    /// touching any resource (same parse as the constructor, plus static range / combination
    /// checks); every problem found, none when the options are fine. API level
    /// [`VALIDATE`](crate::api_level::VALIDATE).
    pub validate_config:
        extern "C" fn(ComponentKind, ComponentConfig) -> PResult<RVec<ConfigProblem>>,
    // abi-append:validate_config:end
    // abi-append:describe_config:begin (API level 5; app/tests/it/abi_versions.rs cuts it out)
    /// What the component named in the config can do with its options ([`ConfigCaps`]),
    /// without constructing it; `RNone` when the plugin does not say (its manifest stands).
    /// API level [`PLAN`](crate::api_level::PLAN).
    pub describe_config:
        extern "C" fn(ComponentKind, ComponentConfig) -> PResult<ROption<ConfigCaps>>,
    // abi-append:describe_config:end
    // abi-append:environment:begin (API level 6; app/tests/it/abi_versions.rs cuts it out)
    /// The environment components of the plugin. API level
    /// [`ENVIRONMENT`](crate::api_level::ENVIRONMENT).
    pub environments: extern "C" fn() -> RVec<EnvironmentDecl>,
    /// Constructs the environment named in the config. Building it reads what it serves
    /// (files, options) and fails with one line when that is wrong; with `run_dir` empty it
    /// starts nothing (`tandem check`).
    pub new_environment: extern "C" fn(EnvironmentConfig, HostBox) -> PResult<EnvironmentBox>,
    // abi-append:environment:end
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "tandem_plugin";
    const NAME: &'static str = "tandem_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// The root module as API level 1 declared it (the prefix up to `new_bridge`): the layout an
/// older plugin's root module is checked against. abi_stable's layout check accepts a library
/// with *more* fields than the loader's type but not fewer, so a plugin built before an
/// appended field fails the check against [`PluginModule`]; [`init_root_module`] then checks
/// it against this prefix instead.
pub mod level1 {
    use crate::caps::PluginManifest;
    use crate::compat::level2::{EngineBox, TrainerBox};
    use crate::compat::level3::BridgeBox;
    use crate::error::PResult;
    use crate::traits::HostBox;
    use crate::types::ComponentConfig;
    use abi_stable::library::RootModule;
    use abi_stable::sabi_types::VersionStrings;
    use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};

    /// [`super::PluginModule`] without the fields appended after `new_bridge` (same name:
    /// abi_stable compares type names).
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
    #[sabi(missing_field(option))]
    pub struct PluginModule {
        /// See [`super::PluginModule::manifest`].
        pub manifest: extern "C" fn() -> PResult<PluginManifest>,
        /// See [`super::PluginModule::new_engine`].
        pub new_engine: extern "C" fn(ComponentConfig, HostBox) -> PResult<EngineBox>,
        /// See [`super::PluginModule::new_trainer`].
        pub new_trainer: extern "C" fn(ComponentConfig, HostBox) -> PResult<TrainerBox>,
        /// See [`super::PluginModule::new_bridge`].
        #[sabi(last_prefix_field)]
        pub new_bridge: extern "C" fn(ComponentConfig, HostBox) -> PResult<BridgeBox>,
    }

    impl RootModule for PluginModuleRef {
        declare_root_module_statics! {PluginModuleRef}
        const BASE_NAME: &'static str = "tandem_plugin";
        const NAME: &'static str = "tandem_plugin";
        const VERSION_STRINGS: VersionStrings = package_version_strings!();
    }
}

/// Initialises the root module of a plugin library (version check, then layout check), also
/// for a plugin built before fields were appended to [`PluginModule`]: when the current layout
/// does not match but the API level 1 prefix does, the module is read through
/// [`PluginModuleRef`] all the same, and each appended field's accessor returns `None` (the
/// accessors consult the field count the *library* recorded, `missing_field(option)`).
pub fn init_root_module(header: &LibHeader) -> Result<PluginModuleRef, LibraryError> {
    match header.init_root_module::<PluginModuleRef>() {
        Err(LibraryError::AbiInstability(report)) => {
            let older = header
                .ensure_layout::<crate::compat::level4::PluginModuleRef>()
                .is_ok()
                || header
                    .ensure_layout::<crate::compat::level3::PluginModuleRef>()
                    .is_ok()
                || header
                    .ensure_layout::<crate::compat::level2::PluginModuleRef>()
                    .is_ok()
                || header.ensure_layout::<level1::PluginModuleRef>().is_ok();
            if !older {
                return Err(LibraryError::AbiInstability(report));
            }
            // SAFETY: the library's root module has the layout of the level-4, level-3,
            // level-2 or level-1 prefix of `PluginModule` (checked just above), whose constructors return
            // the older role traits' objects. A prefix reference reads the fields beyond the
            // library's own field count as absent, and a trait object's vtable records its
            // own method count, so an appended method it lacks runs the trait's default.
            unsafe { header.unchecked_layout::<PluginModuleRef>() }
                .map_err(RootModuleError::into_library_error::<PluginModuleRef>)
        }
        other => other,
    }
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
