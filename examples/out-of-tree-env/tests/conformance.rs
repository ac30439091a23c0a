//! The `countdown` environment against the plugin contract (`tandem-conformance`'s
//! `environment` group), with a held-out split of 32 problems: `cargo test` in this
//! directory.

use tandem_conformance::{EnvironmentSetup, Source, suite};
use tandem_example_countdown::CountdownPlugin;
use tandem_plugin_api::sdk::module_of;

fn countdown() -> EnvironmentSetup {
    EnvironmentSetup::new(Source::Module(module_of::<CountdownPlugin>()), "countdown")
        .options(r#"{"numbers": 5, "max_target": 500}"#)
        .seed(17)
        .held_out(32)
        .probe(256)
}

suite! { environment: countdown(), checks: [environment], }
