//! The `sglang` engine plugin (`libtandem_sglang.so`): one SGLang server per engine rank,
//! launched and supervised here (`python -m sglang.launch_server`, loopback) or attached by
//! URL (`url` / `urls`: the disaggregated case), with the engine ABI mapped onto SGLang
//! 0.5.23's native HTTP routes. See `plugins/sglang/NOTES.md` for the route table, what was
//! checked against SGLang's own definitions and what only a GPU machine can show.

#![forbid(unsafe_code)]

pub mod engine;
pub mod http;
pub mod options;
pub mod response;
pub mod server;

use std::path::Path;
use tandem_plugin_api::sdk::{self, Plugin, Result, engine_box};
use tandem_plugin_api::tags::{KV_CACHE, WEIGHTS};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps, ConfigProblem,
    EngineBox, HostBox, PauseMode, PluginError, PluginManifest, RString, RVec, UpdateKind,
};

pub use engine::SglangEngine;
pub use options::SglangOptions;

/// The `sglang` plugin.
pub struct SglangPlugin;

fn strs(v: &[&str]) -> RVec<RString> {
    v.iter().map(|s| RString::from(*s)).collect()
}

impl Plugin for SglangPlugin {
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

    fn new_engine(config: ComponentConfig, host: HostBox) -> Result<EngineBox> {
        if config.component.as_str() != "sglang" {
            return Err(PluginError::invalid_input(format!(
                "plugin `sglang` has no engine `{}`",
                config.component
            )));
        }
        Ok(engine_box(SglangEngine::new(&config, host)?))
    }

    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        (kind == ComponentKind::Engine && config.component.as_str() == "sglang")
            .then(|| describe(config))
            .flatten()
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if kind != ComponentKind::Engine || config.component.as_str() != "sglang" {
            return vec![ConfigProblem::new(
                "",
                format!(
                    "plugin `sglang` has no {} `{}`",
                    kind.as_str(),
                    config.component
                ),
            )];
        }
        let problems = SglangOptions::problems_of(&config.options_json, config.world_size.max(1));
        if !problems.is_empty() {
            return problems;
        }
        // Launch mode: the Python environment the server would be launched with.
        let opts = match SglangOptions::parse(&config.options_json, config.world_size.max(1)) {
            Ok(o) if o.attach() => return Vec::new(),
            Ok(o) => o,
            Err(e) => return vec![ConfigProblem::new("", e.message.to_string())],
        };
        match opts.launcher() {
            Err(e) => {
                let message = e.message.as_str();
                let message = message.strip_prefix("engine `sglang`: ").unwrap_or(message);
                vec![ConfigProblem::new("python", message).with_help(e.help)]
            }
            Ok(l)
                if l.origin != "the `command` option"
                    && l.program.contains('/')
                    && !Path::new(&l.program).is_file() =>
            {
                vec![
                    ConfigProblem::new(
                        "python",
                        format!("Python `{}` (from {}) does not exist", l.program, l.origin),
                    )
                    .with_help(tandem_plugin_support::python::SETUP_HELP),
                ]
            }
            Ok(_) => Vec::new(),
        }
    }
}

/// What the `sglang` engine does with the options of `config`; `None` when they do not parse
/// (`validate_config` says why).
pub fn describe(config: &ComponentConfig) -> Option<ConfigCaps> {
    let o = SglangOptions::parse(&config.options_json, config.world_size.max(1)).ok()?;
    // Adapter updates only with `--enable-lora`.
    let kinds = if o.enable_lora {
        vec![UpdateKind::Adapter, UpdateKind::CheckpointDir]
    } else {
        vec![UpdateKind::CheckpointDir]
    };
    // A launched server's context is the model's (unless `--context-length` is passed
    // through); an attached one's is its own, unknown here.
    let launched = !o.attach()
        && !o
            .extra_args
            .iter()
            .any(|a| a.starts_with("--context-length"));
    let max_seq_len = if launched {
        tandem_plugin_support::model::max_positions(Path::new(config.model_path.as_str()))
    } else {
        None
    };
    Some(ConfigCaps {
        update_kinds: kinds.into(),
        max_seq_len: max_seq_len.unwrap_or(0),
        // Checkpoints reload in place (`/update_weights_from_disk`). Digests come from the
        // server's `/weights_checker`: an attached `tandem serve` has it, a launched SGLang
        // reports none.
        reports_digest: o.attach(),
        ..ConfigCaps::default()
    })
}

tandem_plugin_api::export_plugin!(SglangPlugin);

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
    fn it_says_lora_digests_and_its_longest_sequence_as_its_options_do() {
        let m = model();
        let launched = describe(&config("sglang", &m, "{}")).expect("parses");
        assert_eq!(
            launched.update_kinds.as_slice(),
            &[UpdateKind::CheckpointDir]
        );
        assert_eq!(launched.max_seq_len, 128, "the model's positions");
        assert!(!launched.reports_digest && !launched.restarts_on_checkpoint);
        let opts = r#"{"url": "http://127.0.0.1:30000", "enable_lora": true}"#;
        let attached = describe(&config("sglang", &m, opts)).expect("parses");
        assert_eq!(
            attached.update_kinds.as_slice(),
            &[UpdateKind::Adapter, UpdateKind::CheckpointDir]
        );
        assert!(
            attached.reports_digest,
            "an attached tandem serve checksums its weights"
        );
        assert_eq!(
            attached.max_seq_len, 0,
            "an attached server's context is its own"
        );
    }
}
