//! The `squeeze` bridge against the plugin contract (`tandem-conformance`'s `bridge` group),
//! moving the native trainer's weights to the native engine: `cargo test` in this directory.

use std::path::PathBuf;
use tandem_conformance::{BridgeSetup, EngineSetup, Source, TrainerSetup, suite};
use tandem_example_squeeze::SqueezePlugin;
use tandem_native_core::{buffer::VecProvider, init};
use tandem_plugin_api::sdk::module_of;
use tandem_plugin_native::NativePlugin;

/// A tiny random-init model, made once per test process.
fn model() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conformance-squeeze");
    let make = || init::init_preset(init::Preset::Tiny, &dir, 7, &mut VecProvider::default());
    DIR.get_or_init(|| make().map(|_| dir.clone()).expect("tiny model"))
        .clone()
}

fn engine() -> EngineSetup {
    EngineSetup::new(
        Source::Module(module_of::<NativePlugin>()),
        "native",
        model(),
    )
}

fn trainer() -> TrainerSetup {
    TrainerSetup::new(
        Source::Module(module_of::<NativePlugin>()),
        "native",
        model(),
    )
}

/// Small buckets (a sync takes several frames), a higher level and two compression threads.
fn bridge() -> BridgeSetup {
    BridgeSetup::new(
        Source::Module(module_of::<SqueezePlugin>()),
        "squeeze",
        r#"{"bucket_mb": 0.01, "level": 3, "threads": 2}"#,
    )
}

suite! { engine: engine(), trainer: trainer(), bridge: bridge(), checks: [bridge], }
