//! What plugin authors write against.
//!
//! A plugin implements plain Rust traits ([`EngineImpl`], [`TrainerImpl`], [`BridgeImpl`],
//! [`Plugin`]) with `Result` and owned types; this module adapts them to the ABI trait objects
//! and runs every call through [`guard`], the one export wrapper that turns a panic into a
//! [`ErrorCode::Panicked`] error instead of letting it unwind into `extern "C"` code (which
//! would abort the process). Then `export_plugin!(MyPlugin)` in a `cdylib` crate, or
//! `register_builtin!(MyPlugin)` in a crate the host links statically.
//!
//! Options: a component's `options` table reaches the plugin as JSON. Parse it with
//! [`parse_options`] in both [`Plugin::validate_config`] (what `tandem check` asks before
//! anything starts) and the constructor, so the two can never disagree; the error names the
//! exact key path.

use crate::caps::{ComponentDecl, ComponentKind, PluginManifest};
use crate::error::{ErrorCode, PResult, PluginError};
use crate::module::{PluginModule, PluginModuleRef};
use crate::traits::{
    BridgeBox, EngineBox, HostBox, InferenceEngine, InferenceEngine_TO, Trainer, Trainer_TO,
    TrainerBox, WeightBridge, WeightBridge_TO,
};
use crate::types::*;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RString, RVec};
use serde::de::DeserializeOwned;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Result type of the SDK traits.
pub type Result<T> = std::result::Result<T, PluginError>;

/// Runs `f`, turning an `Err` into `RErr` and a panic into a [`ErrorCode::Panicked`] error
/// carrying the panic message. Every call into plugin code goes through this.
pub fn guard<T>(f: impl FnOnce() -> Result<T>) -> PResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(err)) => RResult::RErr(err),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            RResult::RErr(
                PluginError::new(ErrorCode::Panicked, format!("plugin panicked: {what}"))
                    .with_help("this is a bug in the plugin; report it with the log above"),
            )
        }
    }
}

fn unsupported<T>(op: &str, component: &str) -> Result<T> {
    Err(PluginError::not_supported(op, component))
}

/// An inference engine, as a plugin author writes it. Unimplemented operations default to a
/// [`ErrorCode::NotSupported`] error; declare what you implement in the manifest.
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
}

/// A weight bridge, as a plugin author writes it.
pub trait BridgeImpl: Send + Sync + 'static {
    /// See [`WeightBridge::trainer_side`].
    fn trainer_side(&self, exported: WeightUpdate) -> Result<WeightUpdate>;
    /// See [`WeightBridge::engine_side`].
    fn engine_side(&self, shipped: WeightUpdate) -> Result<WeightUpdate>;
}

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
}

impl<B: BridgeImpl> WeightBridge for Guarded<B> {
    fn trainer_side(&self, exported: WeightUpdate) -> PResult<WeightUpdate> {
        guard(|| self.0.trainer_side(exported))
    }
    fn engine_side(&self, shipped: WeightUpdate) -> PResult<WeightUpdate> {
        guard(|| self.0.engine_side(shipped))
    }
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

/// A plugin library: its manifest and constructors. Constructors that a plugin does not
/// provide default to a [`ErrorCode::NotSupported`] error.
#[allow(unused_variables)]
pub trait Plugin: 'static {
    /// Name, version and components (see [`manifest`]).
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
    /// constructing it: the constructor's own parse ([`parse_options`]) plus static checks
    /// that need no resources (ranges, enum values, option combinations). Never start a
    /// process, open a model or look for an interpreter here. `tandem check` and `tandem run`
    /// call it before anything starts; the default finds no problems.
    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        Vec::new()
    }
}

/// Parses a component's options JSON (empty = `{}`, i.e. all defaults) into `T`. On failure
/// the problem names the exact key path inside the options table (`lora.rank`,
/// `targets[2]`; an unknown key is named itself) and the message carries no position in the
/// JSON text. Use the same call in [`Plugin::validate_config`] and the constructor.
pub fn parse_options<T: DeserializeOwned>(
    options_json: &str,
) -> std::result::Result<T, ConfigProblem> {
    let json = if options_json.trim().is_empty() {
        "{}"
    } else {
        options_json
    };
    let mut de = serde_json::Deserializer::from_str(json);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut key: Vec<String> = Vec::new();
        for segment in e.path().iter() {
            use serde_path_to_error::Segment;
            match segment {
                Segment::Seq { index } => match key.last_mut() {
                    Some(last) => last.push_str(&format!("[{index}]")),
                    None => key.push(format!("[{index}]")),
                },
                Segment::Map { key: k } | Segment::Enum { variant: k } => key.push(k.clone()),
                Segment::Unknown => {}
            }
        }
        let message = json_message(e.inner());
        // An unknown or missing key is reported at its own path, not at the table holding it.
        if let Some(name) = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|prefix| message.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name)
            && key.last().map(String::as_str) != Some(name)
        {
            key.push(name.to_owned());
        }
        ConfigProblem::new(key.join("."), message)
            .with_help("fix the component's options table in the job file; see `tandem plugins`")
    })?;
    de.end()
        .map_err(|e| ConfigProblem::new("", json_message(&e)))?;
    Ok(value)
}

/// A serde_json error's message without its position in the JSON text (which is the host's
/// serialisation of the job file's table, meaningless to a user).
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_owned()
}

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
    kind: ComponentKind,
    config: ComponentConfig,
) -> PResult<RVec<ConfigProblem>> {
    guard(|| Ok(RVec::from(P::validate_config(kind, &config))))
}
// abi-append:validate_config:end

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
    }
    .leak_into_prefix()
}

/// Exports plugin type `$plugin` as the root module of a `cdylib`.
///
/// Writes the library header abi_stable's loader looks for (what `#[export_root_module]`
/// generates), with paths through this crate so plugin crates need no direct abi_stable
/// dependency. Use it in exactly one `cdylib` crate per plugin: the header is an unmangled
/// symbol, so two of them cannot be linked into one binary.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        fn __tandem_root_module() -> $crate::PluginModuleRef {
            $crate::sdk::module_of::<$plugin>()
        }

        /// Library header read by the Tandem host's loader.
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static TANDEM_PLUGIN_LIB_HEADER: $crate::abi_stable::library::LibHeader = {
            extern "C" fn erased_root_module() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(__tandem_root_module)
            }
            // SAFETY: `erased_root_module` returns the `PrefixRef` of a `PluginModuleRef`
            // erased by abi_stable's own loader helper, which is what `from_constructor`
            // requires for module type `PluginModuleRef`.
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::PluginModuleRef>(
                    erased_root_module,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

/// Registers plugin type `$plugin` as a built-in of any binary that links this crate.
#[macro_export]
macro_rules! register_builtin {
    ($plugin:ty) => {
        $crate::inventory::submit! {
            $crate::module::BuiltinPlugin { root: $crate::sdk::module_of::<$plugin> }
        }
    };
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn export_symbol_matches_abi_stable() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }

    #[test]
    fn guard_turns_panic_into_error() {
        let res: PResult<()> = guard(|| panic!("boom {}", 7));
        match res {
            RResult::RErr(e) => {
                assert_eq!(e.code, ErrorCode::Panicked);
                assert!(e.message.contains("boom 7"), "{}", e.message);
            }
            RResult::ROk(()) => panic!("expected an error"),
        }
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Lora {
        rank: u32,
        #[serde(default)]
        targets: Vec<String>,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Opts {
        max_batch: usize,
        lora: Option<Lora>,
        mode: Mode,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        #[default]
        Fast,
        Slow,
    }

    fn problem(json: &str) -> ConfigProblem {
        match parse_options::<Opts>(json) {
            Ok(o) => panic!("expected a problem, parsed {o:?}"),
            Err(p) => p,
        }
    }

    #[test]
    fn parse_options_defaults_on_empty_and_parses_values() {
        let o: Opts = parse_options("  ").unwrap();
        assert_eq!(o.max_batch, 0);
        let o: Opts = parse_options(
            r#"{"max_batch": 4, "lora": {"rank": 8, "targets": ["q"]}, "mode": "slow"}"#,
        )
        .unwrap();
        assert_eq!(o.max_batch, 4);
        let lora = o.lora.unwrap();
        assert_eq!((lora.rank, lora.targets), (8, vec!["q".to_owned()]));
        assert!(matches!(o.mode, Mode::Slow));
    }

    #[test]
    fn parse_options_names_the_exact_key_path() {
        let p = problem(r#"{"max_batch": "x"}"#);
        assert_eq!(p.key.as_str(), "max_batch");
        assert!(p.message.starts_with("invalid type: string \"x\""), "{p}");
        assert!(!p.message.contains("line 1"), "no JSON position: {p}");
        assert!(!p.help.is_empty());

        let p = problem(r#"{"max_batc": 3}"#);
        assert_eq!(p.key.as_str(), "max_batc", "{p}");
        assert!(p.message.contains("unknown field `max_batc`"), "{p}");

        let p = problem(r#"{"lora": {"rank": 8, "alpha": 1}}"#);
        assert_eq!(p.key.as_str(), "lora.alpha", "{p}");

        let p = problem(r#"{"lora": {"targets": []}}"#);
        assert_eq!(p.key.as_str(), "lora.rank", "{p}");
        assert_eq!(p.message.as_str(), "missing field `rank`", "{p}");

        let p = problem(r#"{"lora": {"rank": -1}}"#);
        assert_eq!(p.key.as_str(), "lora.rank", "{p}");

        let p = problem(r#"{"lora": {"targets": ["q", 3]}}"#);
        assert_eq!(p.key.as_str(), "lora.targets[1]", "{p}");

        let p = problem(r#"{"mode": "medium"}"#);
        assert_eq!(p.key.as_str(), "mode", "{p}");
        assert!(p.message.contains("unknown variant `medium`"), "{p}");

        let p = problem(r#"{"max_batch": 1} x"#);
        assert_eq!(p.key.as_str(), "", "{p}");
        assert_eq!(
            p.to_error("engine `e`").message.as_str(),
            format!("engine `e` options: {}", p.message)
        );
        let p = problem(r#"{"max_batch": 1.5}"#);
        assert_eq!(
            p.to_error("engine `e`").message.as_str(),
            format!("engine `e` options: max_batch: {}", p.message)
        );
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

    #[test]
    fn guard_passes_values_and_errors() {
        assert_eq!(guard(|| Ok(3)), RResult::ROk(3));
        let e = PluginError::invalid_input("bad");
        assert_eq!(guard::<()>(|| Err(e.clone())), RResult::RErr(e));
    }
}
