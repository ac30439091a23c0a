//! An example out-of-tree weight bridge: plugin `example-delta`, bridge component `delta`.
//!
//! After each training step it ships to the engines only the tensors that changed since the
//! last sync, in buckets over the bridge's transport group, through the bridge calls of API
//! level 7. The trainer exports its weights region (`SharedRegion`); the trainer half's
//! `ship` fingerprints every tensor in it and places the changed ones in buckets (each with
//! its offset in the region); `transmit` broadcasts those buckets straight from the region;
//! every engine receives them with its own `apply_weight_update` and checks the digest of its
//! full weights against the trainer's, so a wrong delta is caught. The next delta's baseline
//! is adopted in `after_apply` only when every engine applied and was verified.
//!
//! - `options.rs`: `[bridge.options]` (`bucket_mb`), one parse for `validate_config` and the
//!   constructor.
//! - `changes.rs`: the change detection and the bucket plan (pure, unit-tested).
//! - `delta.rs`: the bridge's calls (`ship`, `transmit`, `receive`, `after_apply`, `stats`)
//!   and the plan. The region is read through the SDK's safe `Region`: no `unsafe` here.
//!
//! Select it in a job file with `[bridge] plugin = "delta"` and load the library with
//! `--plugin-dir`; see this crate's `README.md`.

#![forbid(unsafe_code)]

mod changes;
mod delta;
mod options;

#[cfg(test)]
mod delta_tests;

use options::Options;
use tandem_plugin_api::sdk::{self, Plugin};
use tandem_plugin_api::{
    BridgeBox, Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigProblem, HostBox,
    PluginError, PluginManifest, RString, RVec, UpdateKind,
};

/// The name of the plugin's one component.
const COMPONENT: &str = "delta";

/// The plugin type (`example-delta`).
pub struct DeltaPlugin;

impl Plugin for DeltaPlugin {
    fn manifest() -> PluginManifest {
        sdk::manifest(
            "example-delta",
            env!("CARGO_PKG_VERSION"),
            vec![ComponentDecl {
                kind: ComponentKind::Bridge,
                name: COMPONENT.into(),
                description: "example out-of-tree bridge: ships only the tensors that changed"
                    .into(),
                caps: Capabilities {
                    // The trainer exports its weights region; engines apply tensor buckets.
                    update_kinds: RVec::from(vec![
                        UpdateKind::SharedRegion,
                        UpdateKind::TensorBuckets,
                    ]),
                    notes: RVec::from(vec![
                        RString::from("options: bucket_mb = 64 (bucket size in MiB)"),
                        RString::from("the first sync ships every tensor, later ones the changed"),
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
        Ok(sdk::bridge_box(delta::Delta::new(
            host,
            options.bucket_bytes,
        )))
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if kind != ComponentKind::Bridge {
            return vec![ConfigProblem::new(
                "",
                format!("plugin `example-delta` has no {} components", kind.as_str()),
            )];
        }
        Options::parse(config).err().into_iter().collect()
    }
}

tandem_plugin_api::export_plugin!(DeltaPlugin);
