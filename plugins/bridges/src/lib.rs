//! `tandem-plugin-bridges`: the built-in weight bridges as bridge components of one plugin,
//! `bridges` (built in through `register_builtin!`; the host links it as an rlib).
//!
//! - `ipc` (`ipc.rs`): engines serve the trainer's weights region in place; the layout goes
//!   through the run directory to an engine that never saw it.
//! - `lora` (`passthrough.rs`): PEFT adapters, hot-swapped by the engines.
//! - `checkpoint` (`passthrough.rs`): atomic HF checkpoints; engines restart on them (the
//!   host restarts processes) or reload them in place (`restart = false`).
//! - `broadcast` (`broadcast/`): the trainer's weights region streamed in fixed-size buckets
//!   of whole tensors over the transport group `bridge` to every engine at once.
//!
//! One crate for the four: three are a few lines each over the same option parsing and
//! manifest, and a crate per mode would be four near-empty crates with one dependency each.
//! What each mode guarantees, its failure behaviour and figures: `host/rl/BRIDGE-NOTES.md`.

#![forbid(unsafe_code)]

mod broadcast;
mod ipc;
mod options;
mod passthrough;

use options::Options;
use tandem_plugin_api::sdk::{self, Plugin, Result, bridge_box};
use tandem_plugin_api::{
    BridgeBox, Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps,
    ConfigProblem, HostBox, PluginError, PluginManifest, RString, RVec, UpdateKind,
};

/// The `bridges` plugin.
pub struct BridgesPlugin;

fn bridge(name: &str, description: &str, kinds: &[UpdateKind], notes: &[&str]) -> ComponentDecl {
    ComponentDecl {
        kind: ComponentKind::Bridge,
        name: name.into(),
        description: description.into(),
        caps: Capabilities {
            update_kinds: RVec::from(kinds.to_vec()),
            notes: notes.iter().map(|n| RString::from(*n)).collect(),
            ..Capabilities::default()
        },
    }
}

impl Plugin for BridgesPlugin {
    fn manifest() -> PluginManifest {
        sdk::manifest(
            "bridges",
            env!("CARGO_PKG_VERSION"),
            vec![
                bridge(
                    "ipc",
                    "single copy: engines serve the trainer's weights region in place",
                    &[UpdateKind::SharedRegion],
                    &["engines and trainer on one host; weights stay resident on both sides"],
                ),
                bridge("lora", "LoRA adapter hot swap", &[UpdateKind::Adapter], &[]),
                bridge(
                    "checkpoint",
                    "atomic HF checkpoints; engines restart on them or reload in place",
                    &[UpdateKind::CheckpointDir],
                    &["options: restart = true (default) | false (reload in place)"],
                ),
                bridge(
                    "broadcast",
                    "bucketed broadcast of the trainer's weights over the transport",
                    &[UpdateKind::SharedRegion, UpdateKind::TensorBuckets],
                    &[
                        "options: bucket_mb = 64 (bucket size; a larger tensor travels alone)",
                        "shm between processes on one host, tcp between hosts, nccl on GPU",
                    ],
                ),
            ],
        )
    }

    fn new_bridge(config: ComponentConfig, host: HostBox) -> Result<BridgeBox> {
        let options = Options::parse(&config).map_err(|p| {
            PluginError::invalid_input(format!("bridge.options.{}: {}", p.key, p.message))
                .with_help(p.help.as_str())
        })?;
        Ok(match options {
            Options::Ipc => bridge_box(ipc::Ipc::new(&config)),
            Options::Lora => bridge_box(passthrough::Passthrough::lora()),
            Options::Checkpoint { restart } => {
                bridge_box(passthrough::Passthrough::checkpoint(restart))
            }
            Options::Broadcast { bucket_bytes } => {
                bridge_box(broadcast::Broadcast::new(host, bucket_bytes))
            }
        })
    }

    /// A bridge's kinds are its manifest's whatever the options; the `checkpoint` bridge's
    /// `restart` option says whether engines restart on its checkpoints.
    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        if kind != ComponentKind::Bridge {
            return None;
        }
        let restarts = match Options::parse(config).ok()? {
            Options::Checkpoint { restart } => restart,
            Options::Ipc | Options::Lora | Options::Broadcast { .. } => false,
        };
        let manifest = Self::manifest();
        let decl = manifest
            .components
            .iter()
            .find(|c| c.name.as_str() == config.component.as_str())?;
        Some(ConfigCaps {
            update_kinds: decl.caps.update_kinds.clone(),
            restarts_on_checkpoint: restarts,
            ..ConfigCaps::default()
        })
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if kind != ComponentKind::Bridge {
            return vec![ConfigProblem::new(
                "",
                format!("plugin `bridges` has no {} components", kind.as_str()),
            )];
        }
        match Options::parse(config) {
            Ok(_) => Vec::new(),
            Err(p) => vec![p],
        }
    }
}

tandem_plugin_api::register_builtin!(BridgesPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(component: &str, options: &str) -> ComponentConfig {
        ComponentConfig {
            component: component.into(),
            model_path: "".into(),
            options_json: options.into(),
            rank: 0,
            world_size: 1,
            device: "cpu".into(),
            run_dir: "".into(),
        }
    }

    #[test]
    fn a_bridge_answers_its_manifest_kinds_and_the_checkpoint_bridge_its_restart() {
        let d = |c, o| BridgesPlugin::describe_config(ComponentKind::Bridge, &config(c, o));
        let restart = d("checkpoint", "{}").expect("parses");
        assert_eq!(
            restart.update_kinds.as_slice(),
            &[UpdateKind::CheckpointDir]
        );
        assert!(restart.restarts_on_checkpoint);
        assert!(
            !d("checkpoint", r#"{"restart": false}"#)
                .expect("parses")
                .restarts_on_checkpoint
        );
        let broadcast = d("broadcast", "{}").expect("parses");
        assert_eq!(
            broadcast.update_kinds.as_slice(),
            &[UpdateKind::SharedRegion, UpdateKind::TensorBuckets]
        );
        assert!(d("lora", r#"{"x": 1}"#).is_none());
    }
}
