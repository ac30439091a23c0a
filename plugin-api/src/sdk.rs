//! What plugin authors write against.
//!
//! A plugin implements plain Rust traits ([`EngineImpl`], [`TrainerImpl`], [`BridgeImpl`],
//! [`EnvironmentImpl`], [`Plugin`]) with `Result` and owned types; this module adapts them to the ABI trait objects
//! and runs every call through [`guard`], the one export wrapper that turns a panic into a
//! [`Panicked`](crate::ErrorCode::Panicked) error instead of letting it unwind into
//! `extern "C"` code (which would abort the process). Then `export_plugin!(MyPlugin)` in a
//! `cdylib` crate, or `register_builtin!(MyPlugin)` in a crate the host links statically.
//!
//! Options: a component's `options` table reaches the plugin as JSON. Parse it with
//! [`parse_options`] in both [`Plugin::validate_config`] (what `tandem check` asks before
//! anything starts) and the constructor, so the two can never disagree; the error names the
//! exact key path.
//!
//! This file builds the root module of a plugin ([`module_of`], the `extern "C"` constructor
//! shims) and re-exports the rest, one concern per file under `sdk/`: `traits` (the plain
//! traits), `adapters` (plain traits → ABI trait objects), `guard`, `options`
//! ([`parse_options`]) and `macros` (`export_plugin!`, `register_builtin!`). The root module's
//! appended fields stay in this file, between the `abi-append` markers
//! the ABI-version tests of `app/tests` cut out of `plugin-api/src/sdk.rs` to build a level-1
//! plugin.

mod adapters;
pub mod buckets;
mod guard;
mod macros;
mod options;
pub mod region;
// abi-append:bridge_io:begin
mod sink;
pub use sink::Sink;
// abi-append:bridge_io:end
mod traits;

pub use adapters::{bridge_box, engine_box, environment_box, trainer_box};
pub use guard::guard;
pub use options::parse_options;
pub use traits::{BridgeImpl, EngineImpl, EnvironmentImpl, Plugin, TrainerImpl};

use crate::caps::{ComponentDecl, PluginManifest};
use crate::error::{PResult, PluginError};
use crate::module::{PluginModule, PluginModuleRef};
use crate::traits::{BridgeBox, EngineBox, HostBox, TrainerBox};
use crate::types::ComponentConfig;
use abi_stable::prefix_type::PrefixTypeTrait;

/// Result type of the SDK traits.
pub type Result<T> = std::result::Result<T, PluginError>;

/// Builds a manifest stamped with this crate's API level and ABI version.
pub fn manifest(name: &str, version: &str, components: Vec<ComponentDecl>) -> PluginManifest {
    PluginManifest {
        name: name.into(),
        version: version.into(),
        api_level: crate::API_LEVEL,
        abi_version: crate::ABI_VERSION.into(),
        components: components.into(),
    }
}

extern "C" fn manifest_shim<P: Plugin>() -> PResult<PluginManifest> {
    guard(|| Ok(P::manifest()))
}

extern "C" fn engine_shim<P: Plugin>(config: ComponentConfig, host: HostBox) -> PResult<EngineBox> {
    guard(|| P::new_engine(config, host))
}

extern "C" fn trainer_shim<P: Plugin>(
    config: ComponentConfig,
    host: HostBox,
) -> PResult<TrainerBox> {
    guard(|| P::new_trainer(config, host))
}

extern "C" fn bridge_shim<P: Plugin>(config: ComponentConfig, host: HostBox) -> PResult<BridgeBox> {
    guard(|| P::new_bridge(config, host))
}

// abi-append:validate_config:begin (cut out with the field in module.rs by the ABI tests)
extern "C" fn validate_shim<P: Plugin>(
    kind: crate::caps::ComponentKind,
    config: ComponentConfig,
) -> PResult<abi_stable::std_types::RVec<crate::types::ConfigProblem>> {
    guard(|| Ok(P::validate_config(kind, &config).into()))
}
// abi-append:validate_config:end

// abi-append:describe_config:begin (cut out with the field in module.rs by the ABI tests)
extern "C" fn describe_shim<P: Plugin>(
    kind: crate::caps::ComponentKind,
    config: ComponentConfig,
) -> PResult<abi_stable::std_types::ROption<crate::types::ConfigCaps>> {
    guard(|| Ok(P::describe_config(kind, &config).into()))
}
// abi-append:describe_config:end

// abi-append:environment:begin (cut out with the fields in module.rs by the ABI tests)
extern "C" fn environments_shim<P: Plugin>()
-> abi_stable::std_types::RVec<crate::types::EnvironmentDecl> {
    // A panic listing environments lists none (the guard's error has nowhere to go here).
    match guard(|| Ok(P::environments())) {
        abi_stable::std_types::RResult::ROk(list) => list.into(),
        abi_stable::std_types::RResult::RErr(_) => abi_stable::std_types::RVec::new(),
    }
}

extern "C" fn environment_shim<P: Plugin>(
    config: crate::types::EnvironmentConfig,
    host: HostBox,
) -> PResult<crate::traits::EnvironmentBox> {
    guard(|| P::new_environment(config, host))
}
// abi-append:environment:end

/// The root module of plugin `P`; used by [`crate::export_plugin!`] and
/// [`crate::register_builtin!`] alike, so built-in and dynamic plugins share constructors.
pub fn module_of<P: Plugin>() -> PluginModuleRef {
    PluginModule {
        manifest: manifest_shim::<P>,
        new_engine: engine_shim::<P>,
        new_trainer: trainer_shim::<P>,
        new_bridge: bridge_shim::<P>,
        // abi-append:validate_config:begin
        validate_config: validate_shim::<P>,
        // abi-append:validate_config:end
        // abi-append:describe_config:begin
        describe_config: describe_shim::<P>,
        // abi-append:describe_config:end
        // abi-append:environment:begin
        environments: environments_shim::<P>,
        new_environment: environment_shim::<P>,
        // abi-append:environment:end
    }
    .leak_into_prefix()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::caps::ComponentKind;
    use crate::error::ErrorCode;
    use crate::types::ConfigProblem;
    use abi_stable::std_types::RResult;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // parsed, never read
    struct Opts {
        #[serde(default)]
        max_batch: usize,
    }

    struct Validating;

    impl Plugin for Validating {
        fn manifest() -> PluginManifest {
            manifest("v", "0.1.0", Vec::new())
        }
        fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
            if kind == ComponentKind::Bridge {
                panic!("no bridges here");
            }
            match parse_options::<Opts>(&config.options_json) {
                Ok(_) => Vec::new(),
                Err(p) => vec![p],
            }
        }
    }

    #[test]
    fn validate_config_goes_through_the_root_module_under_the_guard() {
        let module = module_of::<Validating>();
        let validate = module.validate_config().expect("the field is present");
        let config = ComponentConfig {
            component: "v".into(),
            model_path: "".into(),
            options_json: r#"{"max_batch": true}"#.into(),
            rank: 0,
            world_size: 1,
            device: "cpu".into(),
            run_dir: "".into(),
        };
        let problems = validate(ComponentKind::Engine, config.clone()).unwrap();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key.as_str(), "max_batch");
        match validate(ComponentKind::Bridge, config) {
            RResult::RErr(e) => assert_eq!(e.code, ErrorCode::Panicked),
            RResult::ROk(p) => panic!("expected the panic as an error, got {p:?}"),
        }
    }
}
