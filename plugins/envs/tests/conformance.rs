//! The built-in generated environments (`arithmetic`, `reverse`, `word_problems`) against the
//! environment contract (`tandem-conformance`'s `environment` group), each with a held-out
//! split of 16 problems and without one, reached through the `envs` plugin's root module as
//! the host reaches it; and the `dataset` environment on the shipped example data.

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

/// The `dataset` environment on the shipped `examples/data/arith-mix.jsonl` with `options`.
fn dataset(options: &str, held_out: u32) -> EnvironmentSetup {
    setup("dataset", held_out)
        .options(options)
        .base_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/data"))
}

/// Per-source verifiers; 16 held-out rows from `[eval] problems`.
mod dataset_by_source {
    tandem_conformance::suite! {
        environment: super::dataset(r#"{"path": "arith-mix.jsonl", "id": "id", "sources": {
            "arith/int": {"verifier": "last_integer"}, "arith/fraction": {"verifier": "math"},
            "arith/choice": {"verifier": "choice"}}}"#, 16),
        checks: [environment],
    }
}

/// One weighted sum for every row (math and a length penalty); a held-out fraction.
mod dataset_weighted {
    tandem_conformance::suite! {
        environment: super::dataset(r#"{"path": "arith-mix.jsonl", "held_out_fraction": 0.1,
            "reward": {"components": [{"verifier": "math"},
                                      {"verifier": "length", "weight": 0.1, "target": 16}]}}"#, 0),
        checks: [environment],
    }
}
