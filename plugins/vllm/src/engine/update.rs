//! Weight updates and adapters: adapter updates (load under the versioned name, make it the
//! default, unload the previous), checkpoint dirs reloaded in place or by a restart, and LoRA
//! loading.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError, UpdatePayload, UpdateReport, WeightUpdate};

use super::{VllmEngine, lock};
use crate::options::CheckpointApply;

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

impl VllmEngine {
    /// The update itself (the lifecycle check is the caller's).
    pub(super) fn apply_update(&self, update: &WeightUpdate) -> Result<UpdateReport> {
        let started = Instant::now();
        let bytes = match &update.payload {
            UpdatePayload::Adapter { name, dir } => {
                self.require_lora("an adapter update")?;
                let previous = lock(&self.state).active_adapter.clone();
                self.load_lora(name.to_string(), dir.to_string())?;
                lock(&self.state).active_adapter = Some(name.to_string());
                if let Some(prev) = previous.filter(|p| p.as_str() != name.as_str()) {
                    self.unload_lora(prev)?;
                    lock(&self.state).active_adapter = Some(name.to_string());
                }
                let secs = started.elapsed().as_secs_f64();
                lock(&self.state).set_metric("adapter_update_s", secs);
                dir_bytes(Path::new(dir.as_str()))
            }
            UpdatePayload::CheckpointDir { dir } => {
                let dir = PathBuf::from(dir.as_str());
                self.check_checkpoint(&dir)?;
                if self.opts.checkpoint_apply == CheckpointApply::Restart {
                    self.restart_on(&dir)?;
                    lock(&self.state).set_metric("restart_s", started.elapsed().as_secs_f64());
                } else {
                    self.reload_in_place(&dir)?;
                    lock(&self.state).set_metric("reload_s", started.elapsed().as_secs_f64());
                }
                lock(&self.state).served_dir = dir.clone();
                dir_bytes(&dir)
            }
            other => {
                return Err(PluginError::not_supported(
                    &format!("apply_weight_update({})", other.kind().as_str()),
                    "vllm",
                )
                .with_help("use the `lora` or `checkpoint` bridge with engine `vllm` on CPU"));
            }
        };
        let client = self.client()?;
        self.report_version(&client, update.version)?;
        lock(&self.state).version = update.version;
        Ok(UpdateReport {
            version: update.version,
            digest: Default::default(),
            bytes_copied: bytes,
        })
    }

    fn require_lora(&self, op: &str) -> Result<()> {
        if self.opts.enable_lora {
            Ok(())
        } else {
            Err(PluginError::new(
                ErrorCode::NotSupported,
                format!("engine `vllm`: {op} needs LoRA enabled"),
            )
            .with_help(
                "set enable_lora = true (and max_lora_rank ≥ the adapter's r) in [engine] options",
            ))
        }
    }

    fn reload_in_place(&self, dir: &Path) -> Result<()> {
        let was_paused = !lock(&self.state).machine.can_generate();
        if !was_paused {
            self.post("/pause?mode=wait", None, false)?;
        }
        let res = self
            .post_json(
                "/collective_rpc",
                &json!({
                    "method": "tandem_reload_weights",
                    "kwargs": { "weights_path": dir.display().to_string() },
                    "timeout": self.opts.control_timeout_s,
                }),
                true,
            )
            .and_then(|_| self.post("/reset_prefix_cache", None, true).map(drop));
        if !was_paused {
            self.post("/resume", None, true)?;
        }
        res
    }

    fn restart_on(&self, dir: &Path) -> Result<()> {
        let mut slot = lock(&self.server);
        if let Some(mut old) = slot.take() {
            old.stop();
        }
        let server = self.launch(dir)?;
        *slot = Some(server);
        let mut st = lock(&self.state);
        st.adapters.clear();
        st.active_adapter = None;
        Ok(())
    }

    fn check_checkpoint(&self, dir: &Path) -> Result<()> {
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

    pub(super) fn load_lora(&self, name: String, dir: String) -> Result<()> {
        self.require_lora("load_adapter")?;
        if !Path::new(&dir).join("adapter_config.json").is_file() {
            return Err(PluginError::invalid_input(format!(
                "engine `vllm`: adapter directory {dir} has no adapter_config.json"
            ))
            .with_help(
                "give a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)",
            ));
        }
        let reload = lock(&self.state).adapters.contains(&name);
        let started = Instant::now();
        self.post(
            "/v1/load_lora_adapter",
            Some(&json!({ "lora_name": name, "lora_path": dir, "load_inplace": reload })),
            true,
        )?;
        let mut st = lock(&self.state);
        st.set_metric("lora_load_s", started.elapsed().as_secs_f64());
        st.adapters.insert(name);
        Ok(())
    }

    pub(super) fn unload_lora(&self, name: String) -> Result<()> {
        self.require_lora("unload_adapter")?;
        self.post(
            "/v1/unload_lora_adapter",
            Some(&json!({ "lora_name": name })),
            true,
        )?;
        let mut st = lock(&self.state);
        st.adapters.remove(&name);
        if st.active_adapter.as_deref() == Some(name.as_str()) {
            st.active_adapter = None;
        }
        Ok(())
    }
}
