//! Weight updates of the engine, one per payload kind. Each one checks what it will serve
//! against the update's digest (when the update carries one) *before* switching to it, so a
//! damaged or mismatched update leaves the previous weights serving:
//!
//! - `SharedRegion` (`ipc`): the first update checks the trainer's tensor layout against the
//!   served model (one error naming the first difference), maps the trainer's region
//!   (`attach_region`), checks its digest, then serves from it and frees its own weight copy —
//!   the weights exist once. Later updates of the same region are a fence + version bump (0
//!   bytes copied). The trainer must not write while the engine serves (the bridge pauses
//!   generation for the optimizer step).
//! - `CheckpointDir`: reloaded in place. Its config and the run directory's `st256` digest of
//!   its files ([`tandem_plugin_api::files::digest`]) are checked first; a checkpoint that is
//!   the weights' bytes (what the trainer writes) is then read straight into the served
//!   weights — no staged copy; a read that fails half-way marks the weights damaged
//!   (generation refuses) instead of serving a silent mix. Other checkpoints are staged
//!   beside the served weights, then copied in. The dir the engine already serves at the same
//!   version (an engine restarted on the checkpoint) is acknowledged without reloading.
//! - `Adapter` (`lora`): its files' digest checked, loaded under its versioned name, then made the active
//!   adapter (used by requests naming none, and by `score`) — the switch happens between
//!   requests, under the engine lock — and the previously active adapter is unloaded. Its
//!   buffer is kept as the spare the next update of the same shape is read into: a sync then
//!   touches no fresh memory (page faults on a new region cost more than reading the file),
//!   and the engine holds two adapter buffers (the adapter is small beside the model).
//! - `TensorBuckets` (`broadcast`): received bucket by bucket over a transport group and
//!   copied into the served weights in place (`buckets.rs`).

use std::path::Path;
use std::sync::atomic::{Ordering, fence};

use tandem_native_core::config::ModelConfig;
use tandem_native_core::digest::digest;
use tandem_native_core::layout::ParamLayout;
use tandem_native_core::lora::LoraAdapter;
use tandem_native_core::st_io;
use tandem_plugin_api::files::digest::verify_update;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{
    DType, ErrorCode, PluginError, TensorSpec, UpdatePayload, UpdateReport, WeightUpdate,
};

use super::{Inner, NativeEngine, lock};
use crate::common::Ctx;
use crate::provider::{AttachedRegion, Backing};

/// The digest of `data` when the update asks for a check (carries a digest), else empty
/// (not computed: a pass over the weights saved).
pub(super) fn served_digest(update: &WeightUpdate, data: &[f32]) -> String {
    if update.digest.is_empty() {
        String::new()
    } else {
        digest(data)
    }
}

/// Fails when the update carries a digest and `served` differs from it.
pub(super) fn check_digest(update: &WeightUpdate, served: &str, what: &str) -> Result<()> {
    let want = update.digest.as_str();
    if want.is_empty() || want == served {
        return Ok(());
    }
    Err(PluginError::new(
        ErrorCode::Corrupt,
        format!(
            "weight update v{} ({what}): digest mismatch: the trainer exported {want}, the \
             engine would serve {served}; the update was not applied",
            update.version
        ),
    )
    .with_help("the weights changed or were damaged between export and apply; export again"))
}

impl NativeEngine {
    pub(super) fn apply(&self, update: WeightUpdate) -> Result<UpdateReport> {
        let current = lock(&self.inner).weight_version;
        if update.version < current {
            return Err(PluginError::invalid_input(format!(
                "weight update version {} is older than the served version {current}; versions \
                 only go up",
                update.version
            )));
        }
        let (bytes, served) = match &update.payload {
            UpdatePayload::SharedRegion { region, tensors } => {
                self.apply_shared(&update, region.key.as_str(), region.len, tensors.as_slice())?
            }
            UpdatePayload::CheckpointDir { dir } => {
                self.load_checkpoint_dir(&update, Path::new(dir.as_str()))?
            }
            UpdatePayload::Adapter { name, dir } => {
                self.swap_adapter(&update, name.as_str(), Path::new(dir.as_str()))?
            }
            UpdatePayload::TensorBuckets { group, buckets } => {
                self.apply_buckets(&update, group.as_str(), buckets.as_slice())?
            }
        };
        lock(&self.inner).weight_version = update.version;
        Ok(UpdateReport {
            version: update.version,
            digest: served.into(),
            bytes_copied: bytes,
        })
    }

    fn apply_shared(
        &self,
        update: &WeightUpdate,
        key: &str,
        len: u64,
        tensors: &[TensorSpec],
    ) -> Result<(u64, String)> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        if inner.shared.as_deref() == Some(key) {
            // Same region: the trainer wrote in place while we were paused.
            fence(Ordering::SeqCst);
            let served = served_digest(update, inner.engine.model.w());
            check_digest(update, &served, "shared region")?;
            return Ok((0, served));
        }
        if inner.provider.backing() != Backing::Host {
            return Err(PluginError::new(
                ErrorCode::NotAvailable,
                "apply_weight_update(shared_region): this engine has no host memory services to \
                 map the trainer's region with",
            )
            .with_help("run the engine in a `tandem worker` process"));
        }
        let model = &inner.engine.model;
        check_layout(&model.layout, tensors, len).map_err(|e| {
            PluginError::invalid_input(format!(
                "weight update (shared_region {key}): layout mismatch between the trainer's \
                 weights and the served model {}: {e}",
                self.model_dir.display()
            ))
            .with_help("start the engine and the trainer on the same model (same config.json)")
        })?;
        let n = model.layout.total_len();
        let attached = AttachedRegion::attach(&self.host, key, n)
            .map_err(|e| PluginError::new(ErrorCode::Unavailable, format!("weight update: {e}")))?;
        let served = served_digest(update, &attached_slice(&attached)[..n]);
        // On a mismatch `attached` is dropped (unmapped) and the own weights keep serving.
        check_digest(update, &served, "shared region")?;
        let own = std::mem::replace(&mut inner.engine.model.weights, Box::new(attached));
        // The engine's own copy is freed: the weights now exist once, in the trainer's region.
        drop(own);
        inner.shared = Some(key.to_string());
        Ok((0, served))
    }

    fn load_checkpoint_dir(&self, update: &WeightUpdate, dir: &Path) -> Result<(u64, String)> {
        {
            let inner = lock(&self.inner);
            if inner.served_dir == dir && inner.weight_version == update.version {
                let served = verify_update(update, dir)?;
                return Ok((0, served));
            }
            if let Some(key) = &inner.shared {
                return Err(PluginError::invalid_state(format!(
                    "weight update {}: the engine serves the trainer's region {key} in place \
                     (ipc); a checkpoint would overwrite the trainer's weights",
                    dir.display()
                )));
            }
        }
        let cfg = ModelConfig::from_dir(dir).ctx("weight update")?;
        // The files are checked against the trainer's digest before a byte is loaded (the
        // run directory's `st256`, computed from the files as stored; outside the engine
        // lock, so generation goes on meanwhile): a damaged checkpoint leaves the served
        // weights untouched. A published version is never rewritten, so the load below reads
        // the bytes just checked.
        let served = verify_update(update, dir)?;
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let model = &mut inner.engine.model;
        if cfg != model.cfg {
            return Err(PluginError::invalid_input(format!(
                "weight update {}: config.json describes another architecture than the served \
                 model {}",
                dir.display(),
                self.model_dir.display()
            )));
        }
        let files = st_io::model_files(dir).ctx("weight update")?;
        let tied = model.cfg.tie_word_embeddings;
        let rename = |n: &str| (!(tied && n == "lm_head.weight")).then(|| n.to_string());
        let what = format!("weight update {}", dir.display());
        let bytes = (model.layout.total_len() * 4) as u64;
        // A checkpoint that is the weights' bytes (one f32 file in layout order, as the
        // trainer writes it) is read straight into the served weights: no staged copy, so the
        // engine holds the weights once during a reload. Should the read fail half-way, the
        // weights are a mix and the engine refuses to serve them until an update loads.
        if st_io::is_weights_bytes(&files, &model.layout, &rename).ctx(&what)? {
            let n = model.layout.total_len();
            let dst = &mut model.weights.as_mut_slice()[..n];
            if let Err(e) = st_io::load_into(&files, &model.layout, dst, &rename) {
                let why = format!("{what}: reading it in place failed half-way: {e}");
                *lock(&self.damaged) = Some(why.clone());
                return Err(PluginError::new(ErrorCode::Corrupt, why).with_help(
                    "the engine refuses to generate until a weight update loads completely; \
                     restart it on a good checkpoint",
                ));
            }
        } else {
            // Other files (sharded, other dtypes or order): loaded beside the served weights
            // first, so a checkpoint that does not fit leaves them untouched.
            let mut staged = vec![0f32; model.layout.total_len()];
            st_io::load_into(&files, &model.layout, &mut staged, &rename).ctx(&what)?;
            model.copy_weights_from(&staged).ctx("weight update")?;
        }
        inner.served_dir = dir.to_path_buf();
        *lock(&self.damaged) = None;
        Ok((bytes, served))
    }

    fn swap_adapter(&self, update: &WeightUpdate, name: &str, dir: &Path) -> Result<(u64, String)> {
        let what = format!("adapter `{name}` from {}", dir.display());
        let mut guard = lock(&self.inner);
        let inner: &mut Inner = &mut guard;
        // Loaded into its own buffer (the replaced adapter's when the shape matches) and
        // checked before the engine sees it: on an error the active adapter keeps serving.
        let served = verify_update(update, dir)?;
        let (ad, _) = LoraAdapter::load_reusing(
            dir,
            &inner.engine.model.cfg,
            &mut inner.spare_adapter,
            &mut inner.provider,
            false,
        )
        .ctx(&what)?;
        let bytes = (ad.layout.total_len() * 4) as u64;
        inner
            .engine
            .add_adapter(name, ad, &mut inner.provider)
            .ctx(&what)?;
        let previous = inner.active_adapter.replace(name.to_string());
        if let Some(p) = previous.filter(|p| p != name)
            && let Some(old) = inner.engine.take_adapter(&p)
        {
            // Unloaded; its buffer is kept for the next update.
            inner.spare_adapter = Some(old.weights);
        }
        Ok((bytes, served))
    }

    pub(super) fn add_adapter(&self, name: &str, dir: &Path) -> Result<u64> {
        let mut guard = lock(&self.inner);
        let inner: &mut Inner = &mut guard;
        let what = format!("adapter `{name}` from {}", dir.display());
        let ad = LoraAdapter::load(dir, &inner.engine.model.cfg, &mut inner.provider).ctx(&what)?;
        let bytes = (ad.layout.total_len() * 4) as u64;
        inner
            .engine
            .add_adapter(name, ad, &mut inner.provider)
            .ctx(&what)?;
        Ok(bytes)
    }
}

fn attached_slice(a: &AttachedRegion) -> &[f32] {
    use tandem_native_core::buffer::Region;
    a.as_slice()
}

/// Checks the trainer's tensor specs against the served layout; the first difference.
fn check_layout(
    layout: &ParamLayout,
    tensors: &[TensorSpec],
    len: u64,
) -> std::result::Result<(), String> {
    let entries = layout.entries();
    if tensors.len() != entries.len() {
        return Err(format!(
            "the trainer shares {} tensors, the engine serves {}",
            tensors.len(),
            entries.len()
        ));
    }
    for (t, e) in tensors.iter().zip(entries) {
        let shape: Vec<u64> = e.shape.iter().map(|&d| d as u64).collect();
        let offset = (e.offset * 4) as u64;
        if t.name.as_str() != e.name
            || t.shape.as_slice() != shape.as_slice()
            || t.offset != offset
            || t.dtype != DType::F32
        {
            return Err(format!(
                "trainer tensor `{}` {:?} {:?} at byte {} vs engine tensor `{}` {shape:?} F32 at \
                 byte {offset}",
                t.name,
                t.shape.as_slice(),
                t.dtype,
                t.offset,
                e.name
            ));
        }
    }
    let need = (layout.total_len() * 4) as u64;
    if len < need {
        return Err(format!(
            "the region holds {len} bytes, the weights need {need}"
        ));
    }
    Ok(())
}
