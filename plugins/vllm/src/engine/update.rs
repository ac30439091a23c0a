//! vLLM's side of weight updates (the kit's `ServerEngine::apply_update` calls it):
//! checkpoint dirs reloaded in place through Tandem's worker extension or by a restart on
//! the directory, and the LoRA load route.

use std::path::Path;
use std::time::Instant;

use serde_json::json;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{PluginError, UpdatePayload};
use tandem_plugin_support::server_engine::Deadline;

use super::{Vllm, VllmEngine};
use crate::options::CheckpointApply;

/// The error of an update kind vLLM does not apply on CPU.
pub(super) fn unsupported(payload: &UpdatePayload) -> PluginError {
    PluginError::not_supported(
        &format!("apply_weight_update({})", payload.kind().as_str()),
        "vllm",
    )
    .with_help("use the `lora` or `checkpoint` bridge with engine `vllm` on CPU")
}

fn check_checkpoint(dir: &Path) -> Result<()> {
    let has_weights = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        })
        .unwrap_or(false);
    if !has_weights {
        return Err(PluginError::invalid_input(format!(
            "engine `vllm`: checkpoint {} holds no *.safetensors",
            dir.display()
        ))
        .with_help("export a full Hugging Face checkpoint from the trainer"));
    }
    Ok(())
}

impl Vllm {
    /// `checkpoint_apply = "reload"` (in place) or `"restart"` (a new server on `dir`).
    pub(super) fn apply_checkpoint(&self, engine: &VllmEngine, dir: &Path) -> Result<()> {
        let started = Instant::now();
        check_checkpoint(dir)?;
        if self.opts.checkpoint_apply == CheckpointApply::Restart {
            engine.replace_server(|| self.launch(engine, dir))?;
            engine
                .state()
                .set_metric("restart_s", started.elapsed().as_secs_f64());
        } else {
            self.reload_in_place(engine, dir)?;
            engine
                .state()
                .set_metric("reload_s", started.elapsed().as_secs_f64());
        }
        engine.state().served_dir = dir.to_path_buf();
        Ok(())
    }

    /// `/pause?mode=wait` (unless paused) → `/collective_rpc tandem_reload_weights` →
    /// `/reset_prefix_cache` → `/resume` (unless it was paused).
    fn reload_in_place(&self, engine: &VllmEngine, dir: &Path) -> Result<()> {
        let was_paused = !engine.state().machine.can_generate();
        if !was_paused {
            engine.post("/pause?mode=wait", None, Deadline::Request)?;
        }
        let res = engine
            .post_json(
                "/collective_rpc",
                &json!({
                    "method": "tandem_reload_weights",
                    "kwargs": { "weights_path": dir.display().to_string() },
                    "timeout": self.opts.control_timeout_s,
                }),
                Deadline::Control,
            )
            .and_then(|_| {
                engine
                    .post("/reset_prefix_cache", None, Deadline::Control)
                    .map(drop)
            });
        if !was_paused {
            engine.post("/resume", None, Deadline::Control)?;
        }
        res
    }

    /// `/v1/load_lora_adapter` (in place when `name` is loaded already).
    pub(super) fn load_lora(
        &self,
        engine: &VllmEngine,
        name: &str,
        dir: &str,
        loaded: bool,
    ) -> Result<()> {
        if !Path::new(dir).join("adapter_config.json").is_file() {
            return Err(PluginError::invalid_input(format!(
                "engine `vllm`: adapter directory {dir} has no adapter_config.json"
            ))
            .with_help(
                "give a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)",
            ));
        }
        engine.post(
            "/v1/load_lora_adapter",
            Some(&json!({ "lora_name": name, "lora_path": dir, "load_inplace": loaded })),
            Deadline::Control,
        )?;
        Ok(())
    }
}
