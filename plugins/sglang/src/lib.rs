//! The `sglang` engine plugin (`libtandem_sglang.so`): one SGLang server per engine rank,
//! launched and supervised here (`python -m sglang.launch_server`, loopback) or attached by
//! URL (`url` / `urls`: the disaggregated case), with the engine ABI mapped onto SGLang
//! 0.5.23's native HTTP routes. See `plugins/sglang/NOTES.md` for the route table, what was
//! checked against SGLang's own definitions and what only a GPU machine can show.

#![forbid(unsafe_code)]

pub mod engine;
pub mod options;
pub mod response;

use std::path::Path;
use tandem_plugin_api::sdk::{self, Result};
use tandem_plugin_api::tags::{KV_CACHE, WEIGHTS};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps, ConfigProblem,
    PauseMode, PluginManifest, UpdateKind,
};
use tandem_plugin_support::server_engine::Launcher;
use tandem_plugin_support::server_engine::plugin::{Exported, ServerPlugin, strs};

pub use engine::SglangEngine;
pub use options::SglangOptions;

/// The `sglang` plugin (exported as `Exported<SglangPlugin>`).
pub struct SglangPlugin;

impl ServerPlugin for SglangPlugin {
    type Backend = engine::Sglang;

    fn option_problems(config: &ComponentConfig) -> Vec<ConfigProblem> {
        SglangOptions::problems_of(&config.options_json, config.world_size.max(1))
    }

    /// Launch mode only: an attached server needs no Python here.
    fn launcher(config: &ComponentConfig) -> Option<Result<Launcher>> {
        match SglangOptions::parse(&config.options_json, config.world_size.max(1)) {
            Ok(o) if o.attach() => None,
            Ok(o) => Some(o.launcher()),
            Err(e) => Some(Err(e)),
        }
    }

    fn describe(config: &ComponentConfig) -> Option<ConfigCaps> {
        let o = SglangOptions::parse(&config.options_json, config.world_size.max(1)).ok()?;
        Some(o.caps(Path::new(config.model_path.as_str())))
    }

    fn manifest() -> PluginManifest {
        let engine = ComponentDecl {
            kind: ComponentKind::Engine,
            name: "sglang".into(),
            description: "SGLang server per rank (launched on loopback, or attached by URL): \
                          token-in generation with logprobs, pause abort/retract/in-place, \
                          memory release, checkpoint reload and LoRA hot swap"
                .into(),
            caps: Capabilities {
                update_kinds: vec![UpdateKind::Adapter, UpdateKind::CheckpointDir].into(),
                releasable_tags: strs(&[WEIGHTS, KV_CACHE]),
                pause_modes: vec![PauseMode::Abort, PauseMode::Wait, PauseMode::Keep].into(),
                hidden_states: false,
                lora: true,
                needs_gpu: strs(&[
                    "tensor_buckets over NCCL (/init_weights_update_group + \
                 /update_weights_from_distributed inside /begin_weight_update … \
                 /end_weight_update): needs a torch.distributed peer in the trainer",
                    "colocated CUDA-IPC tensors (/update_weights_from_tensor)",
                    "SGLang itself: its kernels are CUDA-only (attach to tandem serve on CPU)",
                ]),
                notes: strs(&[
                    "url / urls attach to running servers (one per engine rank); otherwise \
                 python -m sglang.launch_server per rank (the python option, \
                 $TANDEM_PYTHON or the venv of scripts/setup-python.sh)",
                    "release_memory/resume_memory need enable_memory_saver = true \
                 (--enable-memory-saver); otherwise they answer not_supported: run with \
                 needs_offload = false",
                    "adapter updates and load_adapter need enable_lora = true (--enable-lora)",
                    "weight digests come from /weights_checker's `checksum` (tandem serve); \
                 real SGLang reports none (use [bridge] verify = false); adapters carry none",
                    "binds 127.0.0.1 only unless allow_public_bind = true (then set api_key)",
                ]),
            },
        };
        sdk::manifest("sglang", env!("CARGO_PKG_VERSION"), vec![engine])
    }
}

tandem_plugin_api::export_plugin!(Exported<SglangPlugin>);
