//! What a suite runs: where the plugin comes from, which component, on which model, with which
//! options, and how close engine and trainer logprobs must be.

use std::path::{Path, PathBuf};
use tandem_plugin_api::abi_stable::library::lib_header_from_path;
use tandem_plugin_api::{ComponentDecl, ComponentKind, PluginManifest, PluginModuleRef, RResult};

/// Where a plugin's root module comes from.
#[derive(Clone)]
pub enum Source {
    /// A root module linked into the test binary (`sdk::module_of::<MyPlugin>()`).
    Module(PluginModuleRef),
    /// A plugin library file, loaded the way the host loads it.
    Library(PathBuf),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Module(_) => f.write_str("Module(..)"),
            Source::Library(p) => write!(f, "Library({})", p.display()),
        }
    }
}

impl Source {
    /// `lib<name>.so` in the cargo target directory of the running test binary
    /// (`target/<profile>/`), where `cargo build` puts a workspace's cdylibs.
    pub fn built(name: &str) -> Source {
        Source::Library(target_profile_dir().join(format!("lib{name}.so")))
    }

    /// Loads the root module (a library is `dlopen`ed once and stays loaded).
    pub fn load(&self) -> Result<PluginModuleRef, String> {
        match self {
            Source::Module(m) => Ok(*m),
            Source::Library(path) => {
                if !path.is_file() {
                    return Err(format!(
                        "{}: no such plugin library; build it first, e.g. `cargo build --workspace`",
                        path.display()
                    ));
                }
                lib_header_from_path(path)
                    .and_then(tandem_plugin_api::module::init_root_module)
                    .map_err(|e| {
                        let first = e.to_string();
                        let first = first.lines().next().unwrap_or_default().to_owned();
                        format!("{}: cannot load the plugin: {first}", path.display())
                    })
            }
        }
    }
}

/// `target/<profile>` of the running test binary (`target/<profile>/deps/<test>-<hash>`).
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let deps = exe.parent().unwrap_or(Path::new("."));
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().unwrap_or(deps).to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// A tiny random-init Llama model (`tandem model init --preset tiny --seed 3`) made by the
/// workspace's own `tandem` binary beside the test binary, in `target/tmp/conformance-<name>`
/// (made anew once per test process). For in-tree plugins whose crates cannot create models.
pub fn tiny_model(name: &str) -> PathBuf {
    static MADE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let dir = target_profile_dir()
        .parent()
        .unwrap_or(Path::new("."))
        .join("tmp")
        .join(format!("conformance-{name}"));
    let mut made = MADE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !made.contains(&dir) {
        let _ = std::fs::remove_dir_all(&dir);
        let tandem = target_profile_dir().join("tandem");
        let status = std::process::Command::new(&tandem)
            .args([
                "-q", "model", "init", "--preset", "tiny", "--seed", "3", "--out",
            ])
            .arg(&dir)
            .status();
        match status {
            Ok(s) if s.success() => made.push(dir.clone()),
            other => panic!(
                "{} model init failed ({other:?}); build it first with `cargo build --workspace`",
                tandem.display()
            ),
        }
    }
    dir
}

/// What constructing a component needs: its root module and declaration, a run dir of its
/// own, host services with a CPU memory manager of its own, and rank 0's component config.
pub(crate) struct Parts {
    pub module: PluginModuleRef,
    pub decl: ComponentDecl,
    pub run_dir: tempfile::TempDir,
    pub services: tandem_services::Services,
    pub config: tandem_plugin_api::ComponentConfig,
}

/// Transport groups (name → communicator) a component's services carry: the groups of one
/// rank of an in-process world (the `bridge` group of a bridge check).
pub(crate) type Groups = std::collections::BTreeMap<String, tandem_transport::Communicator>;

/// Loads `source` and prepares the construction of its `component` of `kind`, with
/// `transport` attached to its services when given.
pub(crate) fn parts(
    source: &Source,
    kind: ComponentKind,
    component: &str,
    model: &Path,
    options_json: &str,
    transport: Option<Groups>,
) -> Result<Parts, crate::Failure> {
    use crate::Failure;
    use tandem_memory::{ManagerConfig, MemoryManager};
    let module = source.load().map_err(|e| Failure::new("setup", e))?;
    let (_, decl) = declaration(module, kind, component)
        .map_err(|e| Failure::new("the component is declared", e))?;
    let run_dir = tempfile::tempdir()
        .map_err(|e| Failure::new("setup", format!("creating a run dir: {e}")))?;
    let manager = MemoryManager::new(ManagerConfig::cpu(format!("conformance-{}", kind.as_str())));
    let config = tandem_plugin_api::ComponentConfig {
        component: component.into(),
        model_path: model.display().to_string().into(),
        options_json: options_json.into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: run_dir.path().display().to_string().into(),
    };
    let services = tandem_services::Services::with_memory(manager);
    Ok(Parts {
        module,
        decl,
        run_dir,
        services: match transport {
            Some(groups) => services.with_transport(groups),
            None => services,
        },
        config,
    })
}

/// The manifest and the declaration of `component` of `kind`.
pub(crate) fn declaration(
    module: PluginModuleRef,
    kind: ComponentKind,
    component: &str,
) -> Result<(PluginManifest, ComponentDecl), String> {
    let manifest = match (module.manifest())() {
        RResult::ROk(m) => m,
        RResult::RErr(e) => return Err(format!("reading the manifest failed: {e}")),
    };
    let decl = manifest
        .components
        .iter()
        .find(|c| c.kind == kind && c.name.as_str() == component)
        .cloned()
        .ok_or_else(|| {
            format!(
                "plugin `{}` declares no {} named `{component}`",
                manifest.name,
                kind.as_str()
            )
        })?;
    Ok((manifest, decl))
}

/// An engine component under test.
#[derive(Debug, Clone)]
pub struct EngineSetup {
    /// Where the plugin comes from.
    pub source: Source,
    /// Component name (`[engine] plugin = ...`).
    pub component: String,
    /// Model directory (Hugging Face layout) the engine serves.
    pub model: PathBuf,
    /// `[engine.options]` as JSON.
    pub options_json: String,
    /// Prompts (token ids valid for the model) the checks generate from.
    pub prompts: Vec<Vec<u32>>,
    /// Tokens generated per prompt.
    pub max_tokens: u32,
    /// Largest allowed difference between two logprobs that must agree (engine vs trainer,
    /// `score` vs `generate`).
    pub tolerance: f32,
    /// Whether the engine reports and checks weight digests (`UpdateReport::digest`).
    pub digests: bool,
}

impl EngineSetup {
    /// An engine with default options, two short prompts, tolerance 1e-4 and digests on.
    pub fn new(source: Source, component: &str, model: impl Into<PathBuf>) -> EngineSetup {
        EngineSetup {
            source,
            component: component.into(),
            model: model.into(),
            options_json: "{}".into(),
            prompts: vec![vec![5, 6, 7, 8], vec![9, 10, 11]],
            max_tokens: 4,
            tolerance: 1e-4,
            digests: true,
        }
    }

    /// Sets the component options (JSON object text).
    #[must_use]
    pub fn options(mut self, json: &str) -> Self {
        self.options_json = json.into();
        self
    }

    /// Sets the logprob tolerance.
    #[must_use]
    pub fn tolerance(mut self, tolerance: f32) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Declares that the engine computes no weight digests (the digest rule is then not
    /// checked, and the suite says so).
    #[must_use]
    pub fn without_digests(mut self) -> Self {
        self.digests = false;
        self
    }
}

/// A trainer component under test.
#[derive(Debug, Clone)]
pub struct TrainerSetup {
    /// Where the plugin comes from.
    pub source: Source,
    /// Component name (`[trainer] plugin = ...`).
    pub component: String,
    /// Model directory it trains.
    pub model: PathBuf,
    /// `[trainer.options]` as JSON.
    pub options_json: String,
    /// Training sequences (prompt + completion token ids) and their prompt lengths.
    pub sequences: Vec<(Vec<u32>, u32)>,
    /// Learning rate of the checks' train steps (large enough to change logprobs).
    pub learning_rate: f32,
    /// The update kinds these options export (`None`: every declared kind). A trainer whose
    /// kinds depend on its options (full weights vs LoRA) is run once per configuration.
    pub kinds: Option<Vec<tandem_plugin_api::UpdateKind>>,
}

impl TrainerSetup {
    /// Restricts the exercised update kinds to those these options export.
    #[must_use]
    pub fn kinds(mut self, kinds: &[tandem_plugin_api::UpdateKind]) -> Self {
        self.kinds = Some(kinds.to_vec());
        self
    }

    /// A trainer with default options and two short sequences.
    pub fn new(source: Source, component: &str, model: impl Into<PathBuf>) -> TrainerSetup {
        TrainerSetup {
            source,
            component: component.into(),
            model: model.into(),
            options_json: "{}".into(),
            sequences: vec![(vec![5, 6, 7, 8, 9, 10], 3), (vec![9, 10, 11, 12, 13], 2)],
            learning_rate: 1e-2,
            kinds: None,
        }
    }

    /// Sets the component options (JSON object text).
    #[must_use]
    pub fn options(mut self, json: &str) -> Self {
        self.options_json = json.into();
        self
    }
}

/// A weight bridge under test: it moves the weights of the suite's trainer setup to its
/// engine setup.
#[derive(Debug, Clone)]
pub struct BridgeSetup {
    /// Where the plugin comes from.
    pub source: Source,
    /// Component name (`[bridge] plugin = ...`).
    pub component: String,
    /// `[bridge.options]` as JSON.
    pub options_json: String,
}

impl BridgeSetup {
    /// The bridge `component` of `source` with `options_json` (JSON object text, `{}` for the
    /// defaults).
    pub fn new(source: Source, component: &str, options_json: &str) -> BridgeSetup {
        BridgeSetup {
            source,
            component: component.into(),
            options_json: options_json.into(),
        }
    }
}
