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
use tandem_plugin_api::sdk::{self, Plugin, Result, engine_box};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps, ConfigProblem,
    EngineBox, HostBox, PauseMode, PluginError, PluginManifest, RString, RVec, UpdateKind,
};
use tandem_plugin_support::server_engine::options::{launcher_problems, wrong_component};

pub use engine::VllmEngine;
pub use options::VllmOptions;

/// The `vllm` plugin.
pub struct VllmPlugin;

fn strs(v: &[&str]) -> RVec<RString> {
    v.iter().map(|s| RString::from(*s)).collect()
}

impl Plugin for VllmPlugin {
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

    fn new_engine(config: ComponentConfig, host: HostBox) -> Result<EngineBox> {
        if config.component.as_str() != "vllm" {
            return Err(PluginError::invalid_input(format!(
                "plugin `vllm` has no engine `{}`",
                config.component
            )));
        }
        Ok(engine_box(engine::new_engine(&config, host)?))
    }

    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        (kind == ComponentKind::Engine && config.component.as_str() == "vllm")
            .then(|| describe(config))
            .flatten()
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if let Some(p) = wrong_component(&engine::DIALECT, kind, &config.component) {
            return vec![p];
        }
        // The options, then the Python environment the server would be launched with (what
        // the constructor resolves first): a missing venv is refused before anything starts.
        let problems = VllmOptions::problems_of(&config.options_json);
        if !problems.is_empty() {
            return problems;
        }
        let launcher = VllmOptions::parse(&config.options_json).and_then(|o| o.launcher());
        launcher_problems(&engine::DIALECT, launcher)
    }
}

/// What the `vllm` engine does with the options of `config`; `None` when they do not parse
/// (`validate_config` says why).
pub fn describe(config: &ComponentConfig) -> Option<ConfigCaps> {
    let o = VllmOptions::parse(&config.options_json).ok()?;
    // Adapters only with `--enable-lora` (`require_lora` refuses them otherwise).
    let kinds = if o.enable_lora {
        vec![UpdateKind::Adapter, UpdateKind::CheckpointDir]
    } else {
        vec![UpdateKind::CheckpointDir]
    };
    // `--max-model-len`, else vLLM takes the model's position table.
    let max_seq_len = o.max_model_len.or_else(|| {
        tandem_plugin_support::model::max_positions(Path::new(config.model_path.as_str()))
    });
    Some(ConfigCaps {
        update_kinds: kinds.into(),
        max_seq_len: max_seq_len.unwrap_or(0),
        // `checkpoint_apply = "restart"` starts a new server on the directory.
        restarts_on_checkpoint: o.checkpoint_apply == options::CheckpointApply::Restart,
        // No weight digests; no speculation it manages (no `load_drafter`); `tandem serve`
        // in front of vLLM's own server is untried, so it does not claim to serve.
        ..ConfigCaps::default()
    })
}

tandem_plugin_api::export_plugin!(VllmPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(component: &str, model: &Path, options: &str) -> ComponentConfig {
        ComponentConfig {
            component: component.into(),
            model_path: model.display().to_string().into(),
            options_json: options.into(),
            rank: 0,
            world_size: 1,
            device: "cpu".into(),
            run_dir: "".into(),
        }
    }

    /// A model directory whose position table holds 128 tokens (a `config.json` only).
    fn model() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tandem-describe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("model dir");
        let config = r#"{"max_position_embeddings": 128}"#;
        std::fs::write(dir.join("config.json"), config).expect("config.json");
        dir
    }

    #[test]
    fn it_says_lora_restarts_and_its_longest_sequence_as_its_options_do() {
        let m = model();
        let plain = describe(&config("vllm", &m, "{}")).expect("parses");
        assert_eq!(plain.update_kinds.as_slice(), &[UpdateKind::CheckpointDir]);
        assert_eq!(plain.max_seq_len, 128, "the model's positions");
        assert!(!plain.restarts_on_checkpoint && !plain.reports_digest && !plain.serves);
        let opts = r#"{"enable_lora": true, "checkpoint_apply": "restart", "max_model_len": 96}"#;
        let c = describe(&config("vllm", &m, opts)).expect("parses");
        assert_eq!(
            c.update_kinds.as_slice(),
            &[UpdateKind::Adapter, UpdateKind::CheckpointDir]
        );
        assert!(c.restarts_on_checkpoint);
        assert_eq!(c.max_seq_len, 96);
        assert!(describe(&config("vllm", &m, r#"{"port": "x"}"#)).is_none());
    }
}
