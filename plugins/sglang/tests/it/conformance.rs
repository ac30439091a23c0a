//! The `sglang` engine against the plugin contract, attached (`url`) to a fresh `tandem
//! serve` per engine (the native engine behind SGLang's routes, real tokens and logprobs),
//! with the native trainer (`libtandem_native.so`) producing its updates. Needs `cargo build
//! -p tandem -p tandem-plugin-sglang -p tandem-plugin-native-cdylib` (scripts/test.sh builds
//! the workspace). Every request the plugin sends is traced to
//! `target/tmp/sglang-serve/<engine>.trace.jsonl` for the SGLang contract check. On a GPU
//! machine `$SGLANG_URLS` names real SGLang servers instead (see NOTES.md).

use crate::support;
use tandem_conformance::{EngineSetup, Source, TrainerSetup, suite, tiny_model};
use tandem_plugin_api::UpdateKind as K;

fn engine() -> EngineSetup {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let index = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let model = tiny_model("sglang");
    let (url, real) = support::server_for(index, &model);
    let trace = support::logs_dir().join(format!("engine-{index}.trace.jsonl"));
    let options = serde_json::json!({"url": url, "enable_memory_saver": true, "enable_lora": true,
        "trace_requests": trace, "flush_retries": 5, "request_timeout_s": 120});
    let e = EngineSetup::new(Source::built("tandem_sglang"), "sglang", model);
    let e = e.options(&options.to_string());
    if real { e.tolerance(1e-2) } else { e }
}
fn trainer(options: &str, kind: K) -> TrainerSetup {
    let t = TrainerSetup::new(
        Source::built("tandem_native"),
        "native",
        tiny_model("sglang"),
    );
    t.options(options).kinds(&[kind])
}
suite! { engine: engine(), trainer: trainer("{}", K::CheckpointDir), checks: [engine, pair], }
mod lora {
    use super::*;
    suite! { engine: engine(),
    trainer: trainer(r#"{"lora": {"rank": 4, "alpha": 8}}"#, K::Adapter), checks: [pair],
    ignore: "tandem serve scores prompts under the base weights only (the engine ABI's score \
    takes no adapter); runs against real SGLang: SGLANG_URLS, --ignored (NOTES.md)", }
}
