//! The `megatron` trainer (TP=2: 2 gloo ranks under torchrun) against the plugin contract, its
//! exports served by the native engine (`libtandem_native.so`). Run by `.ci/run`'s real-engine
//! step: `cargo test -p tandem-plugin-megatron --lib -- --ignored --test-threads=1 conformance_tests::`
//! (after `cargo build --workspace`: it loads the built `.so` files).

use tandem_conformance::{EngineSetup, Source, TrainerSetup, suite, tiny_model};
use tandem_plugin_api::UpdateKind as K;

fn engine() -> EngineSetup {
    EngineSetup::new(
        Source::built("tandem_native"),
        "native",
        tiny_model("megatron"),
    )
}
fn trainer() -> TrainerSetup {
    let t = TrainerSetup::new(
        Source::built("tandem_megatron"),
        "megatron",
        tiny_model("megatron"),
    );
    t.options(r#"{"tp": 2}"#).kinds(&[K::CheckpointDir])
}
suite! { engine: engine(), trainer: trainer(),
checks: [trainer, pair],
ignore: "needs torch + megatron-core: TANDEM_PYTHON, --ignored", }
