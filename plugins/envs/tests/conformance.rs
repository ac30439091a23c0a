//! The built-in generated environments (`arithmetic`, `reverse`, `word_problems`) against the
//! environment contract (`tandem-conformance`'s `environment` group), each with a held-out
//! split of 16 problems and without one, reached through the `envs` plugin's root module as
//! the host reaches it.

use tandem_conformance::{EnvironmentSetup, Source};
use tandem_plugin_api::sdk::module_of;
use tandem_plugin_envs::EnvsPlugin;

/// The environment `name` with `held_out` held-out problems and seed 3.
fn setup(name: &str, held_out: u32) -> EnvironmentSetup {
    EnvironmentSetup::new(Source::Module(module_of::<EnvsPlugin>()), name)
        .seed(3)
        .held_out(held_out)
}

/// One module per environment and held-out size (the suite's tests are named per group).
macro_rules! environment {
    ($module:ident, $name:literal, $held_out:literal) => {
        mod $module {
            tandem_conformance::suite! {
                environment: super::setup($name, $held_out),
                checks: [environment],
            }
        }
    };
}

environment!(arithmetic, "arithmetic", 0);
environment!(arithmetic_held_out, "arithmetic", 16);
environment!(reverse, "reverse", 0);
environment!(reverse_held_out, "reverse", 16);
environment!(word_problems, "word_problems", 0);
environment!(word_problems_held_out, "word_problems", 16);
