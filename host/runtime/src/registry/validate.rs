//! Asking a plugin about a component's options before anything starts: to check them
//! (`validate_config`, API level [`VALIDATE`](tandem_plugin_api::api_level::VALIDATE)) and
//! what the component can do with them (`describe_config`, API level
//! [`PLAN`](tandem_plugin_api::api_level::PLAN)). `tandem check` and `tandem run` both go
//! through [`Registry::validate_config`] and [`Registry::describe_config`].

use super::Registry;
use crate::error::RuntimeError;
use tandem_plugin_api::{
    ComponentConfig, ComponentKind, ConfigCaps, ConfigProblem, RResult, api_level,
};

impl Registry {
    /// Asks the plugin providing the component `config.component` of `kind` to check the
    /// options in `config`. `Ok(None)` when it was not asked: no plugin provides the component
    /// (reported elsewhere), or the plugin predates `validate_config` (API level below
    /// [`api_level::VALIDATE`]; logged at debug level). A failing call (an error or a panic in
    /// the plugin) is an error naming the plugin.
    pub fn validate_config(
        &self,
        kind: ComponentKind,
        config: ComponentConfig,
    ) -> Result<Option<Vec<ConfigProblem>>, RuntimeError> {
        let name = config.component.to_string();
        let Some((plugin, _)) = self.component(kind, &name) else {
            return Ok(None);
        };
        let level = plugin.manifest.api_level;
        let validate = if level >= api_level::VALIDATE {
            plugin.module.validate_config()
        } else {
            None
        };
        let Some(validate) = validate else {
            let why = if level < api_level::VALIDATE {
                format!(
                    "is at API level {level} (validate_config needs {})",
                    api_level::VALIDATE
                )
            } else {
                format!("declares API level {level} but its root module has no validate_config")
            };
            tracing::debug!(
                "plugin `{}` ({}) {why}: the options of {} `{name}` are checked when it is \
                 constructed",
                plugin.manifest.name,
                plugin.source,
                kind.as_str()
            );
            return Ok(None);
        };
        match validate(kind, config) {
            RResult::ROk(problems) => Ok(Some(problems.into_vec())),
            RResult::RErr(e) => Err(RuntimeError::plugin(
                format!(
                    "checking the options of {} `{name}` (plugin `{}`, {})",
                    kind.as_str(),
                    plugin.manifest.name,
                    plugin.source
                ),
                e,
            )),
        }
    }

    /// What the component `config.component` of `kind` can do with the options in `config`,
    /// as its plugin answers. `Ok(None)` when the plugin does not say: no plugin provides the
    /// component, the plugin is below [`api_level::PLAN`], or it answers `None` (its manifest
    /// stands). A failing call is an error naming the plugin.
    pub fn describe_config(
        &self,
        kind: ComponentKind,
        config: ComponentConfig,
    ) -> Result<Option<ConfigCaps>, RuntimeError> {
        let name = config.component.to_string();
        let Some((plugin, _)) = self.component(kind, &name) else {
            return Ok(None);
        };
        if plugin.manifest.api_level < api_level::PLAN {
            return Ok(None);
        }
        let Some(describe) = plugin.module.describe_config() else {
            return Ok(None);
        };
        match describe(kind, config) {
            RResult::ROk(caps) => Ok(caps.into_option()),
            RResult::RErr(e) => Err(RuntimeError::plugin(
                format!(
                    "describing {} `{name}` with its options (plugin `{}`, {})",
                    kind.as_str(),
                    plugin.manifest.name,
                    plugin.source
                ),
                e,
            )),
        }
    }
}
