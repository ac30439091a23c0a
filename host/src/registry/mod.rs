//! The plugin registry: built-in plugins (linked statically, registered with `inventory`)
//! merged with dynamic plugins loaded from directories, with one-line errors for every way a
//! library can fail to be a usable plugin.

mod load;

pub use load::{LoadError, plugin_dirs_from_env};

use crate::error::HostError;
use std::path::{Path, PathBuf};
use tandem_plugin_api::{
    BridgeBox, ComponentConfig, ComponentDecl, ComponentKind, EngineBox, HostBox, PResult,
    PluginManifest, PluginModuleRef, RResult, TrainerBox,
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
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.manifest.name)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// All plugins available to this process.
#[derive(Debug, Default)]
pub struct Registry {
    plugins: Vec<LoadedPlugin>,
}

impl Registry {
    /// Built-in plugins plus every plugin library in `dirs` (non-recursive, sorted by path).
    /// Every failure is collected; the registry is returned only if there were none.
    pub fn discover(dirs: &[PathBuf]) -> Result<Registry, Vec<LoadError>> {
        let mut registry = Registry::default();
        let mut errors = Vec::new();
        for builtin in tandem_plugin_api::module::builtin_plugins() {
            match load::from_module((builtin.root)(), PluginSource::Builtin) {
                Ok(p) => registry.insert(p, &mut errors),
                Err(e) => errors.push(e),
            }
        }
        let mut seen = Vec::new();
        for path in load::library_files(dirs, &mut errors) {
            let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
            if seen.contains(&canonical) {
                continue;
            }
            seen.push(canonical);
            match load::from_path(&path) {
                Ok(p) => registry.insert(p, &mut errors),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(registry)
        } else {
            Err(errors)
        }
    }

    fn insert(&mut self, plugin: LoadedPlugin, errors: &mut Vec<LoadError>) {
        if let Some(existing) = self
            .plugins
            .iter()
            .find(|p| p.manifest.name == plugin.manifest.name)
        {
            errors.push(LoadError::Duplicate {
                name: plugin.manifest.name.to_string(),
                first: existing.source.to_string(),
                second: plugin.source.to_string(),
            });
            return;
        }
        for decl in plugin.manifest.components.iter() {
            if let Some((other, _)) = self.component(decl.kind, &decl.name) {
                errors.push(LoadError::DuplicateComponent {
                    kind: decl.kind.as_str(),
                    name: decl.name.to_string(),
                    first: format!("{} ({})", other.manifest.name, other.source),
                    second: format!("{} ({})", plugin.manifest.name, plugin.source),
                });
                return;
            }
        }
        self.plugins.push(plugin);
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
    ) -> Result<T, HostError> {
        let name = config.component.to_string();
        let Some((plugin, _)) = self.component(kind, &name) else {
            let known = self.component_names(kind).join(", ");
            return Err(HostError::Usage(format!(
                "no plugin provides the {} `{name}` (known: {known})",
                kind.as_str()
            )));
        };
        match pick(plugin.module)(config, host) {
            RResult::ROk(v) => Ok(v),
            RResult::RErr(e) => Err(HostError::plugin(
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
    ) -> Result<EngineBox, HostError> {
        self.construct(ComponentKind::Engine, config, host, |m| m.new_engine())
    }

    /// Constructs the trainer named by `config.component`.
    pub fn new_trainer(
        &self,
        config: ComponentConfig,
        host: HostBox,
    ) -> Result<TrainerBox, HostError> {
        self.construct(ComponentKind::Trainer, config, host, |m| m.new_trainer())
    }

    /// Constructs the bridge named by `config.component`.
    pub fn new_bridge(
        &self,
        config: ComponentConfig,
        host: HostBox,
    ) -> Result<BridgeBox, HostError> {
        self.construct(ComponentKind::Bridge, config, host, |m| m.new_bridge())
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
