//! Weight updates and adapters (the lifecycle check is the caller's):
//!
//! - `CheckpointDir` → `/update_weights_from_disk {model_path, weight_version}` (no
//!   begin/end session needed in 0.5.23); with a digest to check, `/weights_checker
//!   {"action":"checksum"}` afterwards: a `checksum` that differs rolls the server back to the
//!   previous directory and version and fails `corrupt`; no `checksum` (real SGLang) = no
//!   digest reported.
//! - `Adapter` → `/load_lora_adapter` under the update's (versioned) name, made the default of
//!   generation, the previous one unloaded, then `/update_weight_version` (loading an adapter
//!   does not move SGLang's label).
//! - Every update: `/model_info`'s `weight_version` read back and checked.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError, UpdatePayload, UpdateReport, WeightUpdate};

use super::calls::Deadline;
use super::{SglangEngine, lock};
use crate::response;

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn unsupported(payload: &UpdatePayload) -> PluginError {
    let kind = payload.kind().as_str();
    PluginError::not_supported(&format!("apply_weight_update({kind})"), "sglang").with_help(
        "use the `checkpoint` or `lora` bridge with engine `sglang`; tensor buckets over NCCL \
         and CUDA-IPC tensors need a GPU (designed in plugins/sglang/NOTES.md)",
    )
}

impl SglangEngine {
    /// `not_supported` for the kinds this engine does not apply (and adapters without LoRA).
    pub(super) fn check_kind(&self, payload: &UpdatePayload) -> Result<()> {
        match payload {
            UpdatePayload::CheckpointDir { .. } => Ok(()),
            UpdatePayload::Adapter { .. } => self.require_lora("an adapter update"),
            other => Err(unsupported(other)),
        }
    }

    pub(super) fn apply_update(&self, update: &WeightUpdate) -> Result<UpdateReport> {
        let started = Instant::now();
        let (bytes, digest) = match &update.payload {
            UpdatePayload::CheckpointDir { dir } => {
                let dir = PathBuf::from(dir.as_str());
                let digest = self.load_checkpoint(&dir, update)?;
                lock(&self.state)
                    .set_metric("checkpoint_update_s", started.elapsed().as_secs_f64());
                (dir_bytes(&dir), digest)
            }
            UpdatePayload::Adapter { name, dir } => {
                let previous = lock(&self.state).active_adapter.clone();
                if lock(&self.state).adapters.contains(name.as_str()) {
                    // Re-applied under the same name: SGLang refuses a name already loaded.
                    self.unload_lora(name)?;
                }
                self.load_lora(name, dir)?;
                lock(&self.state).active_adapter = Some(name.to_string());
                if let Some(prev) = previous.filter(|p| p.as_str() != name.as_str()) {
                    self.unload_lora(&prev)?;
                }
                self.label_version(update.version)?;
                lock(&self.state).set_metric("adapter_update_s", started.elapsed().as_secs_f64());
                // SGLang checksums the base weights, not adapters: no digest to report.
                (dir_bytes(Path::new(dir.as_str())), String::new())
            }
            other => return Err(unsupported(other)),
        };
        let served = self.served_version()?;
        if served != update.version {
            return Err(PluginError::new(
                ErrorCode::Corrupt,
                format!(
                    "engine `sglang`: after applying version {} the server reports version \
                     {served} (GET /model_info)",
                    update.version
                ),
            )
            .with_help("the server did not take the update's weight_version; read its log"));
        }
        lock(&self.state).version = update.version;
        Ok(UpdateReport {
            version: update.version,
            digest: digest.into(),
            bytes_copied: bytes,
        })
    }

    /// `/update_weights_from_disk`, then the digest check; returns the served digest (empty
    /// when the update carries none or the server reports none).
    fn load_checkpoint(&self, dir: &Path, update: &WeightUpdate) -> Result<String> {
        let (previous_dir, previous_version) = {
            let st = lock(&self.state);
            (st.served_dir.clone(), st.version)
        };
        self.load_from_disk(dir, update.version)?;
        lock(&self.state).served_dir = dir.to_path_buf();
        if update.digest.is_empty() {
            return Ok(String::new());
        }
        let v = self.post_json(
            "/weights_checker",
            &json!({ "action": "checksum" }),
            Deadline::Control,
        )?;
        let Some(served) = response::checksum(&v)? else {
            return Ok(String::new());
        };
        if served == update.digest.as_str() {
            return Ok(served);
        }
        // Damaged: back to the weights and version served before.
        let rollback = self.load_from_disk(&previous_dir, previous_version);
        if rollback.is_ok() {
            lock(&self.state).served_dir = previous_dir.clone();
        }
        let mut e = PluginError::new(
            ErrorCode::Corrupt,
            format!(
                "engine `sglang`: weight update v{} ({}): digest mismatch: the trainer exported \
                 {}, the server serves {served}",
                update.version,
                dir.display(),
                update.digest
            ),
        );
        e = match rollback {
            Ok(()) => e.with_help(format!(
                "the checkpoint is damaged; the server is back on {} (version {previous_version})",
                previous_dir.display()
            )),
            Err(r) => e.with_help(format!(
                "the rollback to {} failed too ({}); restart the engine",
                previous_dir.display(),
                r.message
            )),
        };
        Err(e)
    }

    fn load_from_disk(&self, dir: &Path, version: u64) -> Result<()> {
        let v = self.post_json(
            "/update_weights_from_disk",
            &json!({
                "model_path": dir.display().to_string(),
                "weight_version": version.to_string(),
            }),
            Deadline::Control,
        )?;
        response::success(&v, "POST /update_weights_from_disk")
    }

    fn require_lora(&self, op: &str) -> Result<()> {
        if self.opts.enable_lora {
            Ok(())
        } else {
            Err(PluginError::not_supported(op, "sglang").with_help(
                "set enable_lora = true (SGLang's --enable-lora, with max_lora_rank and \
                 lora_target_modules when it starts without adapters) in [engine] options",
            ))
        }
    }

    pub(super) fn load_lora(&self, name: &str, dir: &str) -> Result<()> {
        self.require_lora("load_adapter")?;
        let started = Instant::now();
        let v = self.post_json(
            "/load_lora_adapter",
            &json!({ "lora_name": name, "lora_path": dir }),
            Deadline::Control,
        )?;
        response::success(&v, "POST /load_lora_adapter")?;
        let mut st = lock(&self.state);
        st.set_metric("lora_load_s", started.elapsed().as_secs_f64());
        st.adapters.insert(name.to_owned());
        Ok(())
    }

    pub(super) fn unload_lora(&self, name: &str) -> Result<()> {
        self.require_lora("unload_adapter")?;
        let v = self.post_json(
            "/unload_lora_adapter",
            &json!({ "lora_name": name }),
            Deadline::Control,
        )?;
        response::success(&v, "POST /unload_lora_adapter")?;
        let mut st = lock(&self.state);
        st.adapters.remove(name);
        if st.active_adapter.as_deref() == Some(name) {
            st.active_adapter = None;
        }
        Ok(())
    }
}
