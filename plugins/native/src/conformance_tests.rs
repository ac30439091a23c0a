//! The native engine and trainer against the plugin contract (`tandem-conformance`).
use crate::NativePlugin;
use std::path::PathBuf;
use tandem_conformance::{EngineSetup, Source, TrainerSetup, suite};
use tandem_native_core::{buffer::VecProvider, init};
use tandem_plugin_api::{UpdateKind as K, sdk::module_of};

fn model() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    // `target/tmp` (what an integration test's `CARGO_TARGET_TMPDIR` names).
    let target = tandem_conformance::target_profile_dir();
    let dir = target
        .parent()
        .unwrap_or(&target)
        .join("tmp/conformance-native");
    let make = || init::init_preset(init::Preset::Tiny, &dir, 7, &mut VecProvider::default());
    DIR.get_or_init(|| make().map(|_| dir.clone()).expect("tiny model"))
        .clone()
}
fn native() -> Source {
    Source::Module(module_of::<NativePlugin>())
}
fn engine() -> EngineSetup {
    EngineSetup::new(native(), "native", model())
}
fn trainer(options: &str, kind: K) -> TrainerSetup {
    let t = TrainerSetup::new(native(), "native", model());
    t.options(options).kinds(&[kind])
}
suite! { engine: engine(), trainer: trainer("{}", K::CheckpointDir), checks: [engine, trainer, pair], }
mod ipc {
    super::suite! { engine: super::engine(), trainer: super::trainer("{}", super::K::SharedRegion), checks: [pair], }
}
mod lora {
    super::suite! { engine: super::engine(), trainer: super::trainer(r#"{"lora": {"rank": 4, "alpha": 8}}"#, super::K::Adapter), checks: [pair], }
}
mod drafter {
    fn trainer() -> tandem_conformance::TrainerSetup {
        let t = tandem_conformance::TrainerSetup::new(
            super::native(),
            "native-drafter",
            super::model(),
        );
        t.options(r#"{"max_tokens": 64}"#)
            .kinds(&[super::K::CheckpointDir])
    }
    super::suite! { trainer: trainer(), checks: [features], }
}
