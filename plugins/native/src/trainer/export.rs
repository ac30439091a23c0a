//! Weight export of the trainer, one kind per bridge mode:
//!
//! - `SharedRegion` (`ipc`, full fine-tuning, host memory only): the key of the host region
//!   holding all the weights (the optimizer writes into it in place), the tensor layout inside
//!   it (with the first export of the region only: it cannot change, and the host keeps it),
//!   the version and the digest of the region's contents. No byte is copied. Who reads the
//!   region is the bridge's business: `ipc` engines serve it in place (its plan keeps
//!   `weights` resident, and the engine refuses to release them), `broadcast` reads it only
//!   while it sends; the trainer cannot tell them apart and does not try.
//! - `CheckpointDir` (`checkpoint`, full fine-tuning) and `Adapter` (`lora`): a version
//!   directory under the run dir (`weights/v<N>` / `adapters/v<N>`) through the run-directory
//!   file contract ([`tandem_plugin_api::files::versions`]): files written into the stage
//!   with the trainer state, published by rename. Checkpoints are durable (fsynced);
//!   adapters are not (re-exportable from the trainer; a sync should cost what writing the
//!   adapter costs). The parent keeps the two newest versions; the stage recycles an older
//!   version's dir (its files overwritten in place, see [`st_write`]).
//!
//! Every export carries a digest of what it exports (unless `options.digest = false`:
//! empty): for files the run directory's `st256` digest of the tensors written (what an
//! engine computes from the files), for the shared region the in-memory digest
//! ([`tandem_native_core::digest`]) of all base weights.

use std::path::Path;
use std::sync::atomic::{Ordering, fence};

use tandem_native_core::digest::digest;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{
    DType, PluginError, RString, RVec, SharedRegionRef, TensorSpec, UpdateKind, UpdatePayload,
    WeightUpdate,
};

use tandem_plugin_api::files::state::{STATE_FILE, TrainerState, write_state};
use tandem_plugin_api::files::versions::{
    VersionKind, keep_only, prepare_stage, publish, version_dir, versions_parent,
};

use super::{NativeTrainer, st_write};
use crate::common::Ctx;
use crate::provider::region_key;

impl NativeTrainer {
    /// The digest of the exported weights: base weights, or the adapter in LoRA mode.
    pub(super) fn weights_digest(&mut self) -> Result<String> {
        if !self.opts.digest {
            return Ok(String::new());
        }
        let (tr, _) = self.ready("weight digest")?;
        Ok(match &tr.lora {
            Some(ad) => digest(ad.weights.as_slice()),
            None => digest(tr.model.w()),
        })
    }

    pub(super) fn export(&mut self, kind: UpdateKind) -> Result<WeightUpdate> {
        let lora = self.trainer.as_ref().is_some_and(|t| t.lora.is_some());
        let allowed: &[UpdateKind] = if lora {
            &[UpdateKind::Adapter]
        } else {
            &[UpdateKind::CheckpointDir, UpdateKind::SharedRegion]
        };
        if kind == UpdateKind::TensorBuckets {
            return Err(PluginError::not_supported(
                "export_weight_update(tensor_buckets)",
                "native",
            ));
        }
        if !allowed.contains(&kind) {
            let names: Vec<&str> = allowed.iter().map(|k| k.as_str()).collect();
            return Err(PluginError::invalid_input(format!(
                "export_weight_update({}): this trainer {} exports {} updates",
                kind.as_str(),
                if lora {
                    "trains a LoRA adapter and"
                } else {
                    "fine-tunes all weights and"
                },
                names.join(" or ")
            ))
            .with_help("pick the bridge mode matching the trainer's `lora` option"));
        }
        if kind == UpdateKind::SharedRegion {
            return self.export_shared();
        }
        if self.config.run_dir.is_empty() {
            return Err(PluginError::invalid_input(
                "export_weight_update: the trainer has no run directory (run_dir is empty)",
            ));
        }
        let v = self.version;
        let kind = if lora {
            VersionKind::Adapters
        } else {
            VersionKind::Weights
        };
        let parent = versions_parent(Path::new(self.config.run_dir.as_str()), kind);
        let dir = version_dir(&parent, v);
        let stage = prepare_stage(&parent, v, true)?;
        std::fs::create_dir_all(&stage)
            .map_err(|e| PluginError::io(format!("creating {}: {e}", stage.display())))?;
        let digest = if lora {
            self.write_adapter(&stage)?
        } else {
            self.write_checkpoint(&stage)?
        };
        // A checkpoint is durable state (fsynced); an adapter is re-exported from the trainer
        // at will, so it is only made visible atomically (rename), not forced to disk.
        publish(&stage, &dir, !lora)?;
        let dir_s = RString::from(dir.display().to_string());
        let payload = if lora {
            UpdatePayload::Adapter {
                name: format!("native-v{v}").into(),
                dir: dir_s,
            }
        } else {
            UpdatePayload::CheckpointDir { dir: dir_s }
        };
        Ok(WeightUpdate {
            version: v,
            payload,
            digest: digest.into(),
        })
    }

    /// The PEFT adapter (+ trainer state) in `dir`, without fsync: `save_checkpoint` makes a
    /// checkpoint durable, and on ext4 each fsync also commits whatever else the machine has
    /// dirty, which made a 0.6 MB adapter sync take seconds after a large checkpoint write.
    /// The tensors are streamed from the adapter's buffer ([`st_write`]), over the file of a
    /// recycled version when `dir` holds one. Returns the adapter's digest (empty when
    /// digests are off).
    fn write_adapter(&mut self, dir: &Path) -> Result<String> {
        let version = self.version;
        let with_digest = self.opts.digest;
        let (tr, _) = self.ready("export_weight_update")?;
        let what = format!("writing adapter {}", dir.display());
        let ad = tr.lora.as_ref().ok_or_else(|| {
            PluginError::invalid_state(format!("{what}: the trainer has no adapter"))
        })?;
        ad.save_config(dir).ctx(&what)?;
        let files = [
            "adapter_config.json",
            "adapter_model.safetensors",
            STATE_FILE,
        ];
        keep_only(dir, &files)?;
        let digest = st_write::write(
            &dir.join("adapter_model.safetensors"),
            &ad.layout,
            ad.weights.as_slice(),
            with_digest,
        )
        .map_err(|e| PluginError::io(format!("{what}: {e}")))?;
        let state = serde_json::to_string(&TrainerState::new(version, tr.opt.step))
            .map_err(|e| PluginError::runtime(format!("{what}: {e}")))?;
        tandem_native_core::st_io::write_in_place(&dir.join(STATE_FILE), state.as_bytes())
            .map_err(|e| PluginError::io(format!("{what}: {e}")))?;
        Ok(digest.unwrap_or_default())
    }

    /// A full HF checkpoint (config + one streamed safetensors file + trainer state) in `dir`.
    /// Returns the weights' digest (empty when digests are off).
    fn write_checkpoint(&mut self, dir: &Path) -> Result<String> {
        let version = self.version;
        let with_digest = self.opts.digest;
        let (tr, _) = self.ready("export_weight_update")?;
        let what = format!("writing checkpoint {}", dir.display());
        let io = |e: std::io::Error| PluginError::io(format!("{what}: {e}"));
        std::fs::create_dir_all(dir).map_err(io)?;
        keep_only(dir, &["config.json", "model.safetensors", STATE_FILE])?;
        tr.model.cfg.save(dir).ctx(&what)?;
        let digest = st_write::write(
            &dir.join("model.safetensors"),
            &tr.model.layout,
            tr.model.w(),
            with_digest,
        )
        .map_err(io)?;
        write_state(dir, &TrainerState::new(version, tr.opt.step))?;
        Ok(digest.unwrap_or_default())
    }

    fn export_shared(&mut self) -> Result<WeightUpdate> {
        if !self.host_backed() {
            return Err(PluginError::new(
                tandem_plugin_api::ErrorCode::NotAvailable,
                "export_weight_update(shared_region): the trainer's weights are heap vectors, \
                 not shareable host regions",
            )
            .with_help("run the trainer in a `tandem worker` process (host memory services)"));
        }
        // Every optimizer write of the steps so far happened-before this call (trainer calls
        // run in order on one thread); the fence orders them before the key is published.
        fence(Ordering::SeqCst);
        let digest = self.weights_digest()?;
        let layout_sent = self.layout_sent.take();
        let (tr, _) = self.ready("export_weight_update")?;
        let w = tr.model.w();
        let key = region_key(w.as_ptr()).ok_or_else(|| {
            PluginError::runtime(
                "export_weight_update(shared_region): the weights buffer is not a host region \
                 of this process",
            )
        })?;
        // The layout travels with the first export of a region only: a few hundred specs
        // through the control plane are most of what an `ipc` sync costs otherwise. The host
        // keeps it for engines that attach the region later.
        let tensors = if layout_sent.as_deref() == Some(key.as_str()) {
            RVec::new()
        } else {
            tr.model
                .layout
                .entries()
                .iter()
                .map(|e| TensorSpec {
                    name: e.name.as_str().into(),
                    dtype: DType::F32,
                    shape: e.shape.iter().map(|&d| d as u64).collect(),
                    offset: (e.offset * 4) as u64,
                })
                .collect()
        };
        let region = SharedRegionRef {
            key: key.into(),
            device: "cpu".into(),
            len: (w.len() * 4) as u64,
        };
        self.layout_sent = Some(region.key.to_string());
        Ok(WeightUpdate {
            version: self.version,
            payload: UpdatePayload::SharedRegion { region, tensors },
            digest: digest.into(),
        })
    }
}
