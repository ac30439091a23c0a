//! SGLang's side of weight updates (the kit's `ServerEngine::apply_update` calls it):
//!
//! - `CheckpointDir` → `/update_weights_from_disk {model_path, weight_version}` (no
//!   begin/end session needed in 0.5.23); with a digest to check, `/weights_checker
//!   {"action":"checksum"}` afterwards: a `checksum` that differs rolls the server back to the
//!   previous directory and version and fails `corrupt`; no `checksum` (real SGLang) = no
//!   digest reported.
//! - `Adapter` → `/load_lora_adapter` / `/unload_lora_adapter`, then `/update_weight_version`
//!   (loading an adapter does not move SGLang's label).
//! - Every update: `/model_info`'s `weight_version` read back and checked.

use std::path::Path;

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError, UpdatePayload, WeightUpdate};
use tandem_plugin_support::server_engine::Deadline;

use super::{Sglang, SglangEngine};
use crate::response;

/// The error of an update kind this engine does not apply.
pub(super) fn unsupported(payload: &UpdatePayload) -> PluginError {
    let kind = payload.kind().as_str();
    PluginError::not_supported(&format!("apply_weight_update({kind})"), "sglang").with_help(
        "use the `checkpoint` or `lora` bridge with engine `sglang`; tensor buckets over NCCL \
         and CUDA-IPC tensors need a GPU (designed in plugins/sglang/NOTES.md)",
    )
}

impl Sglang {
    /// `/update_weights_from_disk`, then the digest check; returns the served digest (empty
    /// when the update carries none or the server reports none).
    pub(super) fn load_checked(
        &self,
        engine: &SglangEngine,
        dir: &Path,
        update: &WeightUpdate,
    ) -> Result<String> {
        let (previous_dir, previous_version) = {
            let st = engine.state();
            (st.served_dir.clone(), st.version)
        };
        self.load_from_disk(engine, dir, update.version)?;
        engine.state().served_dir = dir.to_path_buf();
        if update.digest.is_empty() {
            return Ok(String::new());
        }
        let v = engine.post_json(
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
        let rollback = self.load_from_disk(engine, &previous_dir, previous_version);
        if rollback.is_ok() {
            engine.state().served_dir = previous_dir.clone();
        }
        let e = PluginError::new(
            ErrorCode::Corrupt,
            format!(
                "engine `sglang`: weight update v{} ({}): digest mismatch: the trainer exported \
                 {}, the server serves {served}",
                update.version,
                dir.display(),
                update.digest
            ),
        );
        Err(match rollback {
            Ok(()) => e.with_help(format!(
                "the checkpoint is damaged; the server is back on {} (version {previous_version})",
                previous_dir.display()
            )),
            Err(r) => e.with_help(format!(
                "the rollback to {} failed too ({}); restart the engine",
                previous_dir.display(),
                r.message
            )),
        })
    }

    fn load_from_disk(&self, engine: &SglangEngine, dir: &Path, version: u64) -> Result<()> {
        let v = engine.post_json(
            "/update_weights_from_disk",
            &json!({
                "model_path": dir.display().to_string(),
                "weight_version": version.to_string(),
            }),
            Deadline::Control,
        )?;
        response::success(&v, "POST /update_weights_from_disk")
    }

    /// An adapter route answering `{"success", …}`.
    pub(super) fn adapter_route(
        &self,
        engine: &SglangEngine,
        path: &str,
        body: &Value,
    ) -> Result<()> {
        let v = engine.post_json(path, body, Deadline::Control)?;
        response::success(&v, &format!("POST {path}"))
    }

    /// The version of every update: an adapter's labelled with `/update_weight_version`
    /// (a checkpoint's came with `/update_weights_from_disk`), then `/model_info`'s read back.
    pub(super) fn settle(&self, engine: &SglangEngine, update: &WeightUpdate) -> Result<()> {
        if matches!(update.payload, UpdatePayload::Adapter { .. }) {
            let v = engine.post_json(
                "/update_weight_version",
                &json!({ "new_version": update.version.to_string(), "abort_all_requests": false }),
                Deadline::Control,
            )?;
            response::success(&v, "POST /update_weight_version")?;
        }
        let served = self.served_version(engine)?;
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
        Ok(())
    }

    /// The version `/model_info` reports.
    pub(super) fn served_version(&self, engine: &SglangEngine) -> Result<u64> {
        response::model_info_version(&engine.get_json("/model_info")?)
    }
}
