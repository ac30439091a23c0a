//! The plugin registry: built-in plugins (linked statically, registered with `inventory`)
//! merged with dynamic plugins loaded from directories, with one-line errors for every way a
//! library can fail to be a usable plugin.
//!
//! Where plugins come from, in order of precedence: the built-ins; the explicit directories
//! (`--plugin-dir`, the job's `[plugins] dirs`, `TANDEM_PLUGIN_PATH`: every `*.so` in them);
//! the directory of the `tandem` executable itself (only `libtandem_*.so`), which is where
//! `cargo build --workspace` puts the workspace's plugin libraries. A library naming a
//! built-in plugin is skipped (a debug line: the `native` cdylib beside a `tandem` with
//! `native` built in); one next to the executable that clashes (by name or component) with a
//! plugin from an explicit directory is skipped the same way. Any other clash (two libraries
//! with one name, both in explicit directories or both next to the executable) is an error.

mod load;
mod validate;

pub use load::{LoadError, plugin_dirs_from_env};

use crate::error::RuntimeError;
use std::path::{Path, PathBuf};
use tandem_plugin_api::{
    BridgeBox, ComponentConfig, ComponentDecl, ComponentKind, EngineBox, EnvironmentBox,
    EnvironmentConfig, EnvironmentDecl, HostBox, PResult, PluginManifest, PluginModuleRef, RResult,
    TrainerBox,
};

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// Linked into the `tandem` binary.
    Builtin,
    /// Loaded from a library file.
    Path(PathBuf),
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::Builtin => f.write_str("built-in"),
            PluginSource::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A plugin whose root module is loaded and whose manifest was read.
#[derive(Clone)]
pub struct LoadedPlugin {
    /// What the plugin declared.
    pub manifest: PluginManifest,
    /// Where it came from.
    pub source: PluginSource,
    /// Its root module (constructors).
    pub module: PluginModuleRef,
    /// Its environment components (API level 6; none for older plugins).
    pub environments: Vec<EnvironmentDecl>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.manifest.name)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Where a plugin being registered was found (decides who wins a clash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Linked into the binary.
    Builtin,
    /// A directory given by `--plugin-dir`, `[plugins] dirs` or `TANDEM_PLUGIN_PATH`.
    ExplicitDir,
    /// The directory of the running executable.
    ExeDir,
}

/// All plugins available to this process.
#[derive(Debug, Default)]
pub struct Registry {
    plugins: Vec<LoadedPlugin>,
    /// Where each of `plugins` was found (same index).
    origins: Vec<Origin>,
}

impl Registry {
    /// Built-in plugins, every plugin library in `dirs` (non-recursive, sorted by path), then
    /// the `libtandem_*` libraries next to this executable (see the module docs for who wins a
    /// clash). Every failure is collected; the registry is returned only if there were none.
    pub fn discover(dirs: &[PathBuf]) -> Result<Registry, Vec<LoadError>> {
        Registry::discover_in(dirs, load::exe_dir().as_deref())
    }

    /// The built-in plugins linked into this process only (no directory searched): for
    /// tests and benchmarks.
    pub fn builtins() -> Result<Registry, Vec<LoadError>> {
        Registry::discover_in(&[], None)
    }

    /// [`Registry::discover`] with the executable's directory given (`None`: not searched).
    fn discover_in(dirs: &[PathBuf], exe_dir: Option<&Path>) -> Result<Registry, Vec<LoadError>> {
        let mut registry = Registry::default();
        let mut errors = Vec::new();
        for builtin in tandem_plugin_api::module::builtin_plugins() {
            match load::from_module((builtin.root)(), PluginSource::Builtin) {
                Ok(p) => registry.insert(p, Origin::Builtin, &mut errors),
                Err(e) => errors.push(e),
            }
        }
        let explicit = load::library_files(dirs, &mut errors)
            .into_iter()
            .map(|p| (p, Origin::ExplicitDir));
        let beside_exe = exe_dir
            .map(load::exe_dir_files)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p, Origin::ExeDir));
        let mut seen = Vec::new();
        for (path, origin) in explicit.chain(beside_exe) {
            let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
            if seen.contains(&canonical) {
                continue;
            }
            seen.push(canonical);
            match load::from_path(&path) {
                Ok(p) => registry.insert(p, origin, &mut errors),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(registry)
        } else {
            Err(errors)
        }
    }

    /// Adds `plugin` unless it clashes with one already registered. Skipped with a debug
    /// line: a library naming a built-in plugin (the built-in wins), and a library next to
    /// the executable clashing with one from an explicit directory (that one wins). Any other
    /// clash of names or components is an error.
    fn insert(&mut self, plugin: LoadedPlugin, origin: Origin, errors: &mut Vec<LoadError>) {
        let clash = |i: usize| (self.origins[i], &self.plugins[i]);
        if let Some(i) = self
            .plugins
            .iter()
            .position(|p| p.manifest.name == plugin.manifest.name)
        {
            let (their_origin, existing) = clash(i);
            if origin != Origin::Builtin && their_origin == Origin::Builtin {
                tracing::debug!(
                    plugin = %plugin.manifest.name,
                    path = %plugin.source,
                    "skipping a plugin library: a built-in plugin has its name (the built-in wins)"
                );
                return;
            }
            if origin == Origin::ExeDir && their_origin == Origin::ExplicitDir {
                tracing::debug!(
                    plugin = %plugin.manifest.name,
                    path = %plugin.source,
                    loaded = %existing.source,
                    "skipping a plugin library next to the executable: a plugin directory has one of that name (it wins)"
                );
                return;
            }
            errors.push(LoadError::Duplicate {
                name: plugin.manifest.name.to_string(),
                first: existing.source.to_string(),
                second: plugin.source.to_string(),
            });
            return;
        }
        for env in &plugin.environments {
            if let Some(other) = self
                .plugins
                .iter()
                .find(|p| p.environments.iter().any(|e| e.name == env.name))
            {
                errors.push(LoadError::DuplicateComponent {
                    kind: "environment",
                    name: env.name.to_string(),
                    first: format!("{} ({})", other.manifest.name, other.source),
                    second: format!("{} ({})", plugin.manifest.name, plugin.source),
                });
                return;
            }
        }
        for decl in plugin.manifest.components.iter() {
            let Some(i) = self.plugins.iter().position(|p| {
                p.manifest
                    .components
                    .iter()
                    .any(|c| c.kind == decl.kind && c.name == decl.name)
            }) else {
                continue;
            };
            let (their_origin, other) = clash(i);
            if origin == Origin::ExeDir && their_origin == Origin::ExplicitDir {
                tracing::debug!(
                    plugin = %plugin.manifest.name,
                    path = %plugin.source,
                    component = %decl.name,
                    provider = %other.source,
                    "skipping a plugin library next to the executable: a plugin from a plugin directory provides one of its components (it wins)"
                );
                return;
            }
            errors.push(LoadError::DuplicateComponent {
                kind: decl.kind.as_str(),
                name: decl.name.to_string(),
                first: format!("{} ({})", other.manifest.name, other.source),
                second: format!("{} ({})", plugin.manifest.name, plugin.source),
            });
            return;
        }
        self.plugins.push(plugin);
        self.origins.push(origin);
    }

    /// Every loaded plugin, built-ins first.
    pub fn plugins(&self) -> &[LoadedPlugin] {
        &self.plugins
    }

    /// The plugin providing the component `name` of `kind`, and the component's declaration.
    pub fn component(
        &self,
        kind: ComponentKind,
        name: &str,
    ) -> Option<(&LoadedPlugin, &ComponentDecl)> {
        self.plugins.iter().find_map(|p| {
            p.manifest
                .components
                .iter()
                .find(|c| c.kind == kind && c.name.as_str() == name)
                .map(|c| (p, c))
        })
    }

    fn construct<T>(
        &self,
        kind: ComponentKind,
        config: ComponentConfig,
        host: HostBox,
        pick: impl FnOnce(PluginModuleRef) -> extern "C" fn(ComponentConfig, HostBox) -> PResult<T>,
    ) -> Result<T, RuntimeError> {
        let name = config.component.to_string();
        let Some((plugin, _)) = self.component(kind, &name) else {
            let known = self.component_names(kind).join(", ");
            return Err(RuntimeError::usage(format!(
                "no plugin provides the {} `{name}` (known: {known})",
                kind.as_str()
            )));
        };
        match pick(plugin.module)(config, host) {
            RResult::ROk(v) => Ok(v),
            RResult::RErr(e) => Err(RuntimeError::plugin(
                format!(
                    "constructing {} `{name}` of plugin `{}` ({})",
                    kind.as_str(),
                    plugin.manifest.name,
                    plugin.source
                ),
                e,
            )),
        }
    }

    /// Constructs the engine named by `config.component`.
    pub fn new_engine(
        &self,
        config: ComponentConfig,
        host: HostBox,
    ) -> Result<EngineBox, RuntimeError> {
        self.construct(ComponentKind::Engine, config, host, |m| m.new_engine())
    }

    /// Constructs the trainer named by `config.component`.
    pub fn new_trainer(
        &self,
        config: ComponentConfig,
        host: HostBox,
    ) -> Result<TrainerBox, RuntimeError> {
        self.construct(ComponentKind::Trainer, config, host, |m| m.new_trainer())
    }

    /// Constructs the bridge named by `config.component`.
    pub fn new_bridge(
        &self,
        config: ComponentConfig,
        host: HostBox,
    ) -> Result<BridgeBox, RuntimeError> {
        self.construct(ComponentKind::Bridge, config, host, |m| m.new_bridge())
    }

    /// The plugin providing the environment `name`, and its declaration.
    pub fn environment(&self, name: &str) -> Option<(&LoadedPlugin, &EnvironmentDecl)> {
        self.plugins.iter().find_map(|p| {
            p.environments
                .iter()
                .find(|e| e.name.as_str() == name)
                .map(|e| (p, e))
        })
    }

    /// Names of every environment, sorted.
    pub fn environment_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .plugins
            .iter()
            .flat_map(|p| p.environments.iter())
            .map(|e| e.name.to_string())
            .collect();
        names.sort();
        names
    }

    /// Constructs the environment named by `config.component` (in this process).
    pub fn new_environment(
        &self,
        config: EnvironmentConfig,
        host: HostBox,
    ) -> Result<EnvironmentBox, RuntimeError> {
        let name = config.component.to_string();
        let Some((plugin, _)) = self.environment(&name) else {
            return Err(RuntimeError::usage(format!(
                "no plugin provides the environment `{name}` (known: {})",
                self.environment_names().join(", ")
            )));
        };
        let construct = plugin.module.new_environment().ok_or_else(|| {
            RuntimeError::usage(format!(
                "plugin `{}` ({}) lists environments but its root module cannot build them",
                plugin.manifest.name, plugin.source
            ))
        })?;
        match construct(config, host) {
            RResult::ROk(v) => Ok(v),
            RResult::RErr(e) => Err(RuntimeError::plugin(
                format!(
                    "environment `{name}` of plugin `{}` ({})",
                    plugin.manifest.name, plugin.source
                ),
                e,
            )),
        }
    }

    /// Names of every component of `kind`, sorted.
    pub fn component_names(&self, kind: ComponentKind) -> Vec<String> {
        let mut names: Vec<String> = self
            .plugins
            .iter()
            .flat_map(|p| p.manifest.components.iter())
            .filter(|c| c.kind == kind)
            .map(|c| c.name.to_string())
            .collect();
        names.sort();
        names
    }
}

/// Directories from `--plugin-dir`, the job file's `[plugins] dirs` and `TANDEM_PLUGIN_PATH`,
/// in that order, without duplicates.
pub fn plugin_dirs(cli: &[PathBuf], job: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for d in cli.iter().chain(job).cloned().chain(plugin_dirs_from_env()) {
        if !dirs.iter().any(|x| Path::new(x) == d) {
            dirs.push(d);
        }
    }
    dirs
}
