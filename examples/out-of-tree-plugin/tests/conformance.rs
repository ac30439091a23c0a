//! The `reverse` engine against the plugin contract: `cargo test` in this directory.

use tandem_conformance::{EngineSetup, Source, suite};
use tandem_example_reverse::ReversePlugin;
use tandem_plugin_api::sdk::module_of;

/// The engine needs no model; the setup still names a directory.
fn engine() -> EngineSetup {
    EngineSetup::new(Source::Module(module_of::<ReversePlugin>()), "reverse", "/nonexistent")
}

suite! { engine: engine(), checks: [engine], }
