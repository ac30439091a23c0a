//! An example out-of-tree weight bridge that transforms the stream on the way: plugin
//! `example-squeeze`, bridge component `squeeze`.
//!
//! After each training step its trainer half byte-shuffles every bucket of the trainer's
//! weights by element size and compresses it with zstd into a frame the bridge keeps; it
//! ships its own manifest of the frames (a bridge-owned payload, API level 7) and broadcasts
//! the frames over the bridge's transport group. Each engine half receives the frames,
//! checks, decompresses and unshuffles them and hands the buckets to its engine's sink; the
//! engine copies them into the weights it serves and checks their digest against the
//! trainer's. The transform is lossless, so that check passes.
//!
//! - `options.rs`: `[bridge.options]` (`level`, `bucket_mb`, `threads`).
//! - `shuffle.rs`, `codec.rs`: the transform (pure, unit-tested).
//! - `manifest.rs`: the bridge's payload, parsed and checked.
//! - `trainer.rs`, `engine.rs`: the halves; `squeeze.rs`: the bridge object; `stats.rs`: its
//!   figures.
//!
//! No `unsafe`: regions are mapped through the SDK's [`Region`](tandem_plugin_api::sdk::region::Region).
//! Select it in a job file with `[bridge] plugin = "squeeze"` and load the library with
//! `--plugin-dir`; see this crate's `README.md`.

#![forbid(unsafe_code)]

mod codec;
mod engine;
mod manifest;
mod options;
mod shuffle;
mod squeeze;
mod stats;
mod trainer;

#[cfg(test)]
mod squeeze_tests;

use options::Options;
use tandem_plugin_api::sdk::{self, Plugin};
use tandem_plugin_api::{
    BridgeBox, Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigProblem, HostBox,
    PluginError, PluginManifest, RString, RVec, UpdateKind,
};

/// The name of the plugin's one component.
const COMPONENT: &str = "squeeze";

/// The plugin type (`example-squeeze`).
pub struct SqueezePlugin;

impl Plugin for SqueezePlugin {
    fn manifest() -> PluginManifest {
        sdk::manifest(
            "example-squeeze",
            env!("CARGO_PKG_VERSION"),
            vec![ComponentDecl {
                kind: ComponentKind::Bridge,
                name: COMPONENT.into(),
                description: "example out-of-tree bridge: ships the weights byte-shuffled and \
                              zstd-compressed"
                    .into(),
                caps: Capabilities {
                    // The trainer exports its weights region; engines take tensor buckets
                    // (what the sink feeds them).
                    update_kinds: RVec::from(vec![
                        UpdateKind::SharedRegion,
                        UpdateKind::TensorBuckets,
                    ]),
                    notes: RVec::from(vec![
                        RString::from("options: level = 1 (zstd), bucket_mb = 64, threads = 1"),
                        RString::from("lossless: the engines' digest check passes"),
                    ]),
                    ..Capabilities::default()
                },
            }],
        )
    }

    fn new_bridge(config: ComponentConfig, host: HostBox) -> sdk::Result<BridgeBox> {
        let options = Options::parse(&config).map_err(|p| {
            let key = match p.key.as_str() {
                "" => "bridge.options".to_owned(),
                k => format!("bridge.options.{k}"),
            };
            PluginError::invalid_input(format!("{key}: {}", p.message)).with_help(p.help.as_str())
        })?;
        Ok(sdk::bridge_box(squeeze::Squeeze::new(host, options)))
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if kind != ComponentKind::Bridge {
            return vec![ConfigProblem::new(
                "",
                format!(
                    "plugin `example-squeeze` has no {} components",
                    kind.as_str()
                ),
            )];
        }
        Options::parse(config).err().into_iter().collect()
    }
}

tandem_plugin_api::export_plugin!(SqueezePlugin);
