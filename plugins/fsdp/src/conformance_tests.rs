//! The `fsdp` trainer (2 gloo ranks under torchrun) against the plugin contract, its exports
//! served by the native engine (`libtandem_native.so`). Run by `.ci/run`'s real-engine step:
//! `cargo test -p tandem-plugin-fsdp --lib -- --ignored --test-threads=1 conformance_tests::`
//! (after `cargo build --workspace`: it loads the built `.so` files).

use tandem_conformance::{EngineSetup, Source, TrainerSetup, suite, tiny_model};
use tandem_plugin_api::UpdateKind as K;

fn engine() -> EngineSetup {
    EngineSetup::new(Source::built("tandem_native"), "native", tiny_model("fsdp"))
}
fn trainer(options: &str, kind: K) -> TrainerSetup {
    let t = TrainerSetup::new(Source::built("tandem_fsdp"), "fsdp", tiny_model("fsdp"));
    t.options(options).kinds(&[kind])
}
suite! { engine: engine(), trainer: trainer(r#"{"ranks": 2}"#, K::CheckpointDir),
checks: [trainer, pair], ignore: "needs torch: TANDEM_PYTHON, --ignored", }
mod lora {
    use super::*;
    const LORA: &str = r#"{"ranks": 2, "lora": {"rank": 8, "alpha": 16, "seed": 3}}"#;
    suite! { engine: engine(), trainer: trainer(LORA, K::Adapter), checks: [pair],
    ignore: "needs torch: TANDEM_PYTHON, --ignored", }
}
