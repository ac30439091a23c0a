//! `tandem-plugin-envs`: the built-in environments as environment components of one plugin,
//! `envs` (built in through `register_builtin!`; the host links it as an rlib).
//!
//! - `arithmetic`, `reverse`, `word_problems` (`tasks/`, `generated.rs`): problems generated
//!   from `(seed, index)`, a held-out split generated from a derived seed, rewards from the
//!   completion text.
//! - `dataset` (`dataset/`): rows of a JSONL, Parquet or `datasets` `save_to_disk` file,
//!   scored by the built-in verifiers (`verify/`: exact, last_integer, boxed, math, regex,
//!   choice, json_schema, length, weighted sums) or a Python reward, per data source.
//! - `python` (`python/`): a Python environment class, and Python reward functions for the
//!   other environments, in a pool of worker processes the environment owns.
//!
//! Design, invariants and figures: `NOTES.md`.
//!
//! What an environment promises the host (determinism per index, unique ids, rewards in
//! range, failures reported as failures) is the contract of `tandem_plugin_api::types::env`,
//! checked by the conformance group `environment`.

#![forbid(unsafe_code)]

mod dataset;
mod generated;
pub mod python;
pub mod tasks;
pub mod verify;

use tandem_plugin_api::sdk::{self, Plugin, Result};
use tandem_plugin_api::{
    EnvironmentBox, EnvironmentConfig, EnvironmentDecl, HostBox, PluginError, PluginManifest,
};

/// The `envs` plugin.
pub struct EnvsPlugin;

fn decl(name: &str, description: &str) -> EnvironmentDecl {
    EnvironmentDecl {
        name: name.into(),
        description: description.into(),
    }
}

impl Plugin for EnvsPlugin {
    fn manifest() -> PluginManifest {
        sdk::manifest("envs", env!("CARGO_PKG_VERSION"), Vec::new())
    }

    fn environments() -> Vec<EnvironmentDecl> {
        vec![
            decl("arithmetic", "generated small-number sums and differences"),
            decl("reverse", "generated strings to write backwards"),
            decl("word_problems", "generated grade-school word problems"),
            decl(
                "dataset",
                "rows of a JSONL, Parquet or `save_to_disk` dataset, scored by built-in verifiers",
            ),
            decl(
                "python",
                "a Python environment class (`class = \"module:Class\"`) in a pool of worker processes",
            ),
        ]
    }

    fn new_environment(config: EnvironmentConfig, _host: HostBox) -> Result<EnvironmentBox> {
        match config.component.as_str() {
            kind if tasks::KINDS.contains(&kind) => generated::build(&config),
            "dataset" => dataset::build(&config),
            "python" => python::env::build(&config),
            other => Err(PluginError::invalid_input(format!(
                "the `envs` plugin has no environment `{other}`"
            ))),
        }
    }
}

tandem_plugin_api::register_builtin!(EnvsPlugin);
