//! The built-in bridges against the plugin contract (`tandem-conformance`'s `bridge` group),
//! each moving the native trainer's weights to the native engine on a tiny model.
use std::path::PathBuf;
use tandem_conformance::{BridgeSetup, EngineSetup, Source, TrainerSetup, suite};
use tandem_native_core::{buffer::VecProvider, init};
use tandem_plugin_api::sdk::module_of;

fn model() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conformance-bridges");
    let make = || init::init_preset(init::Preset::Tiny, &dir, 7, &mut VecProvider::default());
    DIR.get_or_init(|| make().map(|_| dir.clone()).expect("tiny model"))
        .clone()
}
fn native() -> Source {
    Source::Module(module_of::<tandem_plugin_native::NativePlugin>())
}
fn engine() -> EngineSetup {
    EngineSetup::new(native(), "native", model())
}
fn trainer(options: &str) -> TrainerSetup {
    TrainerSetup::new(native(), "native", model()).options(options)
}
fn bridge(component: &str, options: &str) -> BridgeSetup {
    let bridges = Source::Module(module_of::<tandem_plugin_bridges::BridgesPlugin>());
    BridgeSetup::new(bridges, component, options)
}
mod ipc {
    super::suite! { engine: super::engine(), trainer: super::trainer("{}"), bridge: super::bridge("ipc", "{}"), checks: [bridge], }
}
mod lora {
    super::suite! { engine: super::engine(), trainer: super::trainer(r#"{"lora": {"rank": 4, "alpha": 8}}"#), bridge: super::bridge("lora", "{}"), checks: [bridge], }
}
mod checkpoint {
    super::suite! { engine: super::engine(), trainer: super::trainer("{}"), bridge: super::bridge("checkpoint", "{}"), checks: [bridge], }
}
mod checkpoint_in_place {
    super::suite! { engine: super::engine(), trainer: super::trainer("{}"), bridge: super::bridge("checkpoint", r#"{"restart": false}"#), checks: [bridge], }
}
mod broadcast {
    super::suite! { engine: super::engine(), trainer: super::trainer("{}"), bridge: super::bridge("broadcast", r#"{"bucket_mb": 0.01}"#), checks: [bridge], }
}
