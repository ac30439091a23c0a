//! `example-countdown`: an environment plugin built outside the Tandem workspace (it depends
//! on `tandem-plugin-api` only). Environment `countdown`: reach a target number from given
//! numbers with `+ - * /`; the reward parses the expression on the completion's last line,
//! checks that it uses only the given numbers (each at most once) and evaluates it exactly.

#![deny(unsafe_code)]

pub mod env;
pub mod expr;
pub mod options;
pub mod problem;

use tandem_plugin_api::sdk::{self, Plugin, Result};
use tandem_plugin_api::{
    EnvironmentBox, EnvironmentConfig, EnvironmentDecl, HostBox, PluginError, PluginManifest,
};

/// The plugin.
pub struct CountdownPlugin;

impl Plugin for CountdownPlugin {
    fn manifest() -> PluginManifest {
        sdk::manifest("example-countdown", env!("CARGO_PKG_VERSION"), Vec::new())
    }

    fn environments() -> Vec<EnvironmentDecl> {
        vec![EnvironmentDecl {
            name: "countdown".into(),
            description: "example out-of-tree environment: reach a target from given numbers \
                          with + - * /"
                .into(),
        }]
    }

    fn new_environment(config: EnvironmentConfig, _host: HostBox) -> Result<EnvironmentBox> {
        if config.component.as_str() != "countdown" {
            return Err(PluginError::invalid_input(format!(
                "the `example-countdown` plugin has no environment `{}`",
                config.component
            )));
        }
        let options = options::Options::parse(config.options_json.as_str()).map_err(|p| {
            PluginError::invalid_input(format!("environment.options.{}: {}", p.key, p.message))
        })?;
        let env = env::Countdown::new(options, config.seed, config.held_out)?;
        Ok(sdk::environment_box(env))
    }
}

tandem_plugin_api::export_plugin!(CountdownPlugin);
