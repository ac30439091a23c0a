//! The [`Plugin`] of a plugin whose one component is a server engine: the component name
//! checked on every entry point, the engine boxed for the ABI, `validate_config` as the
//! options' problems and then the launcher's. A plugin implements [`ServerPlugin`] and
//! exports `Exported<ItsPlugin>`.

use std::marker::PhantomData;

use tandem_plugin_api::sdk::{Plugin, Result, engine_box};
use tandem_plugin_api::{
    ComponentConfig, ComponentKind, ConfigCaps, ConfigProblem, EngineBox, HostBox, PluginError,
    PluginManifest, RString, RVec,
};

use super::options::{launcher_problems, wrong_component};
use super::{Backend, Launcher};

/// A manifest's list of strings.
pub fn strs(v: &[&str]) -> RVec<RString> {
    v.iter().map(|s| RString::from(*s)).collect()
}

/// What a server plugin says about its one engine component.
pub trait ServerPlugin: 'static {
    /// The engine's server.
    type Backend: Backend;
    /// The manifest: the plugin and its one engine component, both named with literals
    /// (`tandem-tidy` reads them there).
    fn manifest() -> PluginManifest;
    /// The problems of the options of `config` (parse and static checks).
    fn option_problems(config: &ComponentConfig) -> Vec<ConfigProblem>;
    /// The launcher the options of `config` name; `None` when the engine launches nothing
    /// (it attaches to running servers).
    fn launcher(config: &ComponentConfig) -> Option<Result<Launcher>>;
    /// What the engine does with the options of `config`; `None` when they do not parse.
    fn describe(config: &ComponentConfig) -> Option<ConfigCaps>;
}

/// The exported plugin of a [`ServerPlugin`]: `tandem_plugin_api::export_plugin!(Exported<P>)`.
pub struct Exported<P>(PhantomData<P>);

fn is_ours<P: ServerPlugin>(kind: ComponentKind, component: &str) -> bool {
    wrong_component(<P::Backend as Backend>::DIALECT, kind, component).is_none()
}

impl<P: ServerPlugin> Plugin for Exported<P> {
    fn manifest() -> PluginManifest {
        P::manifest()
    }

    fn new_engine(config: ComponentConfig, host: HostBox) -> Result<EngineBox> {
        if !is_ours::<P>(ComponentKind::Engine, &config.component) {
            return Err(PluginError::invalid_input(format!(
                "plugin `{}` has no engine `{}`",
                <P::Backend as Backend>::DIALECT.component,
                config.component
            )));
        }
        Ok(engine_box(P::Backend::engine(&config, host)?))
    }

    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        is_ours::<P>(kind, &config.component)
            .then(|| P::describe(config))
            .flatten()
    }

    /// The options, then the Python environment the server would be launched with (what
    /// the constructor resolves first): a missing venv is refused before anything starts.
    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        let dialect = <P::Backend as Backend>::DIALECT;
        if let Some(p) = wrong_component(dialect, kind, &config.component) {
            return vec![p];
        }
        let problems = P::option_problems(config);
        if !problems.is_empty() {
            return problems;
        }
        match P::launcher(config) {
            Some(launcher) => launcher_problems(dialect, launcher),
            None => Vec::new(),
        }
    }
}
