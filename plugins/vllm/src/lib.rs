//! The `vllm` engine plugin (`libtandem_vllm.so`): launches and supervises one vLLM OpenAI
//! server per engine rank on loopback and maps the engine ABI onto its HTTP routes.
//! See `plugins/vllm/NOTES.md` for the route map, what works on CPU and the measured figures.

#![forbid(unsafe_code)]

/// The plugin contract (`tandem-conformance`) against this plugin's built library.
#[cfg(test)]
mod conformance_tests;
pub mod engine;
pub mod options;
pub mod response;

use std::path::Path;
use tandem_plugin_api::sdk::{self, Result};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps, ConfigProblem,
    PauseMode, PluginManifest, RVec, UpdateKind,
};
use tandem_plugin_support::server_engine::Launcher;
use tandem_plugin_support::server_engine::plugin::{Exported, ServerPlugin, strs};

pub use engine::VllmEngine;
pub use options::VllmOptions;

/// The `vllm` plugin (exported as `Exported<VllmPlugin>`).
pub struct VllmPlugin;

impl ServerPlugin for VllmPlugin {
    type Backend = engine::Vllm;

    fn option_problems(config: &ComponentConfig) -> Vec<ConfigProblem> {
        VllmOptions::problems_of(&config.options_json)
    }

    fn launcher(config: &ComponentConfig) -> Option<Result<Launcher>> {
        Some(VllmOptions::parse(&config.options_json).and_then(|o| o.launcher()))
    }

    fn describe(config: &ComponentConfig) -> Option<ConfigCaps> {
        let model = Path::new(config.model_path.as_str());
        Some(VllmOptions::parse(&config.options_json).ok()?.caps(model))
    }

    fn manifest() -> PluginManifest {
        let engine = ComponentDecl {
            kind: ComponentKind::Engine,
            name: "vllm".into(),
            description:
                "vLLM OpenAI server per rank (loopback, dev mode): token-in generation with \
                 logprobs, pause/resume, LoRA hot swap, checkpoint reload in place"
                    .into(),
            caps: Capabilities {
                update_kinds: vec![UpdateKind::Adapter, UpdateKind::CheckpointDir].into(),
                // vLLM's CPU worker ignores sleep mode: /sleep frees nothing here.
                releasable_tags: RVec::new(),
                pause_modes: vec![PauseMode::Abort, PauseMode::Wait, PauseMode::Keep].into(),
                hidden_states: false,
                lora: true,
                needs_gpu: strs(&[
                    "release_memory frees weights/kv_cache (vLLM sleep mode: CUDA/ROCm/XPU only)",
                    "tensor_buckets over NCCL (vLLM weight-transfer engine, --weight-transfer-config nccl)",
                    "single-copy CUDA IPC weight sync (vLLM worker extension)",
                ]),
                notes: strs(&[
                    "needs Python with vllm: the python option, else $TANDEM_PYTHON, else the venv scripts/setup-python.sh records (bash scripts/setup.sh)",
                    "release_memory/resume_memory are not supported on CPU (vLLM's CPU worker frees nothing in sleep mode): run it with needs_offload = false",
                    "binds 127.0.0.1 only unless allow_public_bind = true (dev-mode routes are unauthenticated)",
                    "checkpoint_dir: reloaded in place (default; reload_weights + a tied lm_head repair in Tandem's worker extension); checkpoint_apply = \"restart\" starts a new server on the dir",
                    "adapter/lora needs enable_lora = true; no weight digests (use [bridge] verify = false)",
                ]),
            },
        };
        sdk::manifest("vllm", env!("CARGO_PKG_VERSION"), vec![engine])
    }
}

tandem_plugin_api::export_plugin!(Exported<VllmPlugin>);
