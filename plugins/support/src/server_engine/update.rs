//! Weight updates and adapters (the lifecycle around them included): an update kind the
//! server does not apply is `NotSupported` in any state; otherwise the machine enters
//! `Updating` (a version below the served one is refused before the server is asked),
//! [`ServerEngine::apply_update`] applies it, and the machine leaves `Updating` with the new
//! version or the old one.
//!
//! Digests: the update's directory is checked against the trainer's digest before the server
//! is asked to load it — the run directory's `st256` digest computed here from the files
//! ([`tandem_plugin_api::files::digest::verify_update`]), the same definition the trainer
//! computed from the tensors it wrote. The server then loads those very files (a published
//! version is never rewritten), so the digest of the files is the digest of what it serves;
//! a damaged file is refused as `corrupt` and the server keeps its previous weights. A server
//! that checksums what it loaded itself (an attached `tandem serve`) is asked as well.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tandem_plugin_api::files::digest::verify_update;
use tandem_plugin_api::files::dir_bytes;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{PluginError, UpdatePayload, UpdateReport, WeightUpdate};

use super::engine::{ServerEngine, lock};
use super::{Backend, Checkpoint};

impl<B: Backend> ServerEngine<B> {
    /// `apply_weight_update`: the kind check, the lifecycle, then [`Self::apply_update`].
    pub(super) fn update(&self, update: &WeightUpdate) -> Result<UpdateReport> {
        match &update.payload {
            UpdatePayload::CheckpointDir { .. } => {}
            UpdatePayload::Adapter { .. } => self.require_lora("an adapter update")?,
            other => return Err(self.backend.unsupported_update(other)),
        }
        lock(&self.state)
            .machine
            .begin_update(update.version)
            .map_err(|e| self.illegal(e))?;
        let result = self.apply_update(update);
        lock(&self.state).machine.finish_update(result.is_ok());
        result
    }

    /// The one place an update reaches the server: a `CheckpointDir` is loaded by the
    /// backend ([`Backend::load_checkpoint`]: reload in place, restart, or load from disk),
    /// an `Adapter` is loaded under its versioned name, made generation's default, and the
    /// previous one unloaded; then the backend settles the server's version label and the
    /// engine serves `update.version`. The lifecycle check is the caller's.
    pub fn apply_update(&self, update: &WeightUpdate) -> Result<UpdateReport> {
        let started = Instant::now();
        let (bytes, digest) = match &update.payload {
            UpdatePayload::CheckpointDir { dir } => {
                let dir = PathBuf::from(dir.as_str());
                let checked = verify_update(update, &dir)?;
                let job = Checkpoint { dir: &dir, update };
                let served = self.backend.load_checkpoint(self, job)?;
                let digest = if served.is_empty() { checked } else { served };
                (dir_bytes(&dir), digest)
            }
            UpdatePayload::Adapter { name, dir } => {
                let checked = verify_update(update, Path::new(dir.as_str()))?;
                let previous = lock(&self.state).active_adapter.clone();
                let loaded = lock(&self.state).adapters.contains(name.as_str());
                if loaded && !B::RELOADS_ADAPTERS {
                    // Re-applied under the same name to a server that refuses a loaded name.
                    self.unload_lora(name)?;
                }
                self.load_lora(name, dir)?;
                lock(&self.state).active_adapter = Some(name.to_string());
                if let Some(prev) = previous.filter(|p| p.as_str() != name.as_str()) {
                    self.unload_lora(&prev)?;
                }
                lock(&self.state).set_metric("adapter_update_s", started.elapsed().as_secs_f64());
                // Servers checksum base weights, not adapters: the files' digest is reported.
                (dir_bytes(Path::new(dir.as_str())), checked)
            }
            other => return Err(self.backend.unsupported_update(other)),
        };
        self.backend.settle_version(self, update)?;
        lock(&self.state).version = update.version;
        Ok(UpdateReport {
            version: update.version,
            digest: digest.into(),
            bytes_copied: bytes,
        })
    }

    fn require_lora(&self, op: &str) -> Result<()> {
        if self.settings.lora {
            Ok(())
        } else {
            let d = B::DIALECT;
            Err(PluginError::not_supported(op, d.component).with_help(B::LORA_HELP))
        }
    }

    /// `load_adapter`: the backend's load route, then the adapter is known as loaded.
    pub(super) fn load_lora(&self, name: &str, dir: &str) -> Result<()> {
        self.require_lora("load_adapter")?;
        let loaded = lock(&self.state).adapters.contains(name);
        let started = Instant::now();
        self.backend.load_adapter(self, name, dir, loaded)?;
        let mut st = lock(&self.state);
        st.set_metric("lora_load_s", started.elapsed().as_secs_f64());
        st.adapters.insert(name.to_owned());
        Ok(())
    }

    /// `unload_adapter`: the backend's unload route; generation's default is dropped with it.
    pub(super) fn unload_lora(&self, name: &str) -> Result<()> {
        self.require_lora("unload_adapter")?;
        self.backend.unload_adapter(self, name)?;
        let mut st = lock(&self.state);
        st.adapters.remove(name);
        if st.active_adapter.as_deref() == Some(name) {
            st.active_adapter = None;
        }
        Ok(())
    }
}
