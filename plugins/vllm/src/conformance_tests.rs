//! The `vllm` engine against the plugin contract on a real vLLM server, with the native
//! trainer (`libtandem_native.so`) producing its updates. Run by `.ci/run`'s real-engine step:
//! `cargo test -p tandem-plugin-vllm --lib -- --ignored --test-threads=1 conformance_tests::`
//! (after `cargo build --workspace`: it loads the built `.so` files).

use tandem_conformance::{EngineSetup, Source, TrainerSetup, suite, tiny_model};
use tandem_plugin_api::UpdateKind as K;

const OPTIONS: &str = r#"{"max_model_len": 1024, "enable_lora": true, "max_lora_rank": 8,
    "request_timeout_s": 120, "control_timeout_s": 60}"#;

fn engine() -> EngineSetup {
    let e = EngineSetup::new(Source::built("tandem_vllm"), "vllm", tiny_model("vllm"));
    e.options(OPTIONS).tolerance(1e-3)
}
fn trainer(options: &str, kind: K) -> TrainerSetup {
    let t = TrainerSetup::new(Source::built("tandem_native"), "native", tiny_model("vllm"));
    t.options(options).kinds(&[kind])
}
suite! { engine: engine(), trainer: trainer("{}", K::CheckpointDir), checks: [engine, pair],
ignore: "needs vLLM: TANDEM_PYTHON, --ignored", }
mod lora {
    use super::*;
    suite! { engine: engine(), trainer: trainer(r#"{"lora": {"rank": 4, "alpha": 8}}"#, K::Adapter),
    checks: [pair],
    ignore: "needs vLLM: TANDEM_PYTHON, --ignored", }
}
