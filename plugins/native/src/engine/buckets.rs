//! `TensorBuckets` updates (the `broadcast` bridge): the weights arrive over a transport
//! group in buckets of whole tensors, in the wire format of
//! [`tandem_plugin_api::sdk::buckets`].
//!
//! Each bucket is received into one of two buffers the engine keeps across syncs (they grow to
//! the largest bucket once; `bucket_stream.rs` receives the next bucket into one while this
//! module copies out of the other), its trailer checked (index, version, length, checksum),
//! and only then its tensors copied into the served weights in place — no staged copy of the
//! model: during a sync the engine holds the weights once plus two buckets. When every bucket is in, the
//! digest of the served weights is compared with the trainer's.
//!
//! Failures:
//! - A manifest that does not fit the served model (unknown tensor, other shape or dtype, a
//!   tensor outside its bucket) or an engine serving the trainer's region in place (`ipc`) is
//!   refused before any byte is copied; the engine still takes every bucket off the group
//!   (and drops it) so the sender and the other engines finish the broadcast, and keeps
//!   serving its previous weights.
//! - A bucket whose trailer does not check (damaged, short, out of step): nothing of it is
//!   copied and no later bucket is. When it is the first bucket, the previous weights are
//!   intact and keep serving; after some buckets were copied the weights are a mix of two
//!   versions and the engine marks them damaged — generation refuses until a complete update
//!   loads. (Keeping the previous version through a failure half-way would need a second copy
//!   of every bucket's destination, the whole-model staging copy this update exists to avoid.)
//! - A transport error (the sender or another receiver died, a timeout) ends the receive at
//!   once; the weights are marked damaged when a bucket had been copied.
//! - A digest mismatch after the last bucket: damaged, likewise.

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::sdk::buckets;
use tandem_plugin_api::{DType, PluginError, TensorBucket, WeightUpdate};

use super::bucket_stream;
use super::update::{check_digest, served_digest};
use super::{NativeEngine, lock};
use tandem_native_core::layout::ParamLayout;

/// One tensor of a bucket: where it is in the bucket and in the served weights (f32 units).
struct Copy {
    src: usize,
    dst: usize,
    len: usize,
}

impl NativeEngine {
    pub(super) fn apply_buckets(
        &self,
        update: &WeightUpdate,
        group: &str,
        manifest: &[TensorBucket],
    ) -> Result<(u64, String)> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let weights_bytes = (inner.engine.model.layout.total_len() * 4) as u64;
        let largest = manifest.iter().map(|b| b.bytes).max().unwrap_or(0);
        if largest > weights_bytes.max(1) {
            // Not even drained: a bucket larger than the model is no bucket of this model.
            return Err(PluginError::invalid_input(format!(
                "weight update v{} (tensor buckets on `{group}`): a bucket of {largest} bytes is \
                 larger than the served weights ({weights_bytes} bytes)",
                update.version
            )));
        }
        // Refusals found before any byte arrives: every bucket is still taken off the group.
        let mut problem = inner.shared.as_ref().map(|key| {
            PluginError::invalid_state(format!(
                "weight update v{}: the engine serves the trainer's region {key} in place (ipc); \
                 received buckets would overwrite the trainer's weights",
                update.version
            ))
        });
        let plans: Vec<Vec<Copy>> = match plan_copies(&inner.engine.model.layout, manifest) {
            Ok(p) => p,
            Err(e) => {
                problem.get_or_insert(PluginError::invalid_input(format!(
                    "weight update v{} (tensor buckets on `{group}`): {e}; the update was not \
                     applied",
                    update.version
                )));
                Vec::new()
            }
        };
        let words = (largest as usize).div_ceil(4);
        let mut bufs = std::mem::take(&mut inner.bucket_bufs);
        for b in &mut bufs {
            if b.len() < words {
                b.resize(words, 0.0);
            }
        }
        let mut copied_any = false;
        let weights = inner.engine.model.weights.as_mut_slice();
        let streamed = bucket_stream::receive(&self.host, group, manifest, &mut bufs, |r| {
            if problem.is_some() {
                return;
            }
            if let Err(e) = buckets::check(r.data, r.trailer, update.version, r.k as u32) {
                problem = Some(e);
                return;
            }
            for c in &plans[r.k] {
                weights[c.dst..c.dst + c.len].copy_from_slice(&r.words[c.src..c.src + c.len]);
            }
            copied_any = true;
        });
        inner.bucket_bufs = bufs;
        let received = match streamed {
            Ok(n) => n,
            Err((k, e)) => {
                let e = PluginError::new(
                    e.code,
                    format!(
                        "weight update v{}: receiving bucket {k} of {}: {}",
                        update.version,
                        manifest.len(),
                        e.message
                    ),
                );
                return Err(self.fail(e, copied_any));
            }
        };
        if let Some(e) = problem {
            return Err(self.fail(e, copied_any));
        }
        let served = served_digest(update, inner.engine.model.w());
        if let Err(e) = check_digest(update, &served, "tensor buckets") {
            return Err(self.fail(e, copied_any));
        }
        inner.served_dir = Default::default();
        *lock(&self.damaged) = None;
        Ok((received, served))
    }

    /// `e`, and — when some bucket was already copied — the weights marked damaged.
    fn fail(&self, e: PluginError, copied_any: bool) -> PluginError {
        if !copied_any {
            let mut e = e;
            e.message = format!("{}; the previous weights keep serving", e.message).into();
            return e;
        }
        let why = format!("{}; buckets before it were already copied", e.message);
        *lock(&self.damaged) = Some(why.clone());
        PluginError::new(e.code, why).with_help(
            "the engine refuses to generate until a weight update loads completely; sync again",
        )
    }
}

/// For each bucket, its tensors' places in the bucket and in the served weights; the first
/// tensor that does not fit the served model.
fn plan_copies(
    layout: &ParamLayout,
    manifest: &[TensorBucket],
) -> std::result::Result<Vec<Vec<Copy>>, String> {
    manifest
        .iter()
        .enumerate()
        .map(|(k, bucket)| {
            bucket
                .tensors
                .iter()
                .map(|t| {
                    let e = layout.get(t.name.as_str()).ok_or_else(|| {
                        format!(
                            "bucket {k} carries `{}`, a tensor the model has not",
                            t.name
                        )
                    })?;
                    let shape: Vec<u64> = e.shape.iter().map(|&d| d as u64).collect();
                    if t.dtype != DType::F32 || t.shape.as_slice() != shape.as_slice() {
                        return Err(format!(
                            "bucket {k}: `{}` is {:?} {:?}, the engine serves F32 {shape:?}",
                            t.name,
                            t.dtype,
                            t.shape.as_slice()
                        ));
                    }
                    let bytes = buckets::tensor_bytes(t);
                    if t.offset % 4 != 0 || t.offset + bytes > bucket.bytes {
                        return Err(format!(
                            "bucket {k}: `{}` at byte {} ({bytes} bytes) is not inside the \
                             bucket's {} bytes on a 4-byte boundary",
                            t.name, t.offset, bucket.bytes
                        ));
                    }
                    Ok(Copy {
                        src: (t.offset / 4) as usize,
                        dst: e.offset,
                        len: e.numel(),
                    })
                })
                .collect()
        })
        .collect()
}
