//! `delta`: the bridge's halves.
//!
//! - Trainer half (`trainer_side`, trainer process): takes the trainer's `SharedRegion`
//!   export (key + tensor layout; later exports of the same region carry no layout, so the
//!   one seen first is kept), maps the region, fingerprints every tensor and ships the
//!   changed ones ([`changes`](crate::changes)) as a `TensorBuckets` manifest on
//!   [`BRIDGE_GROUP`] with the export's version and digest. The digest covers the full
//!   weights: each engine checks its full served weights against it after the last bucket,
//!   so a delta against weights an engine does not hold is refused, never served.
//! - `send` (trainer process, while every engine applies): for each bucket, a broadcast of
//!   its bytes straight from the mapped region, then of its 32-byte trailer
//!   ([`buckets::trailer`]). The region is only read.
//! - Engine half: checks the update is `TensorBuckets` and hands it to the engine's
//!   `apply_weight_update` (which receives the buckets).
//!
//! The baseline a delta is computed against is the fingerprints of the last sync this
//! bridge planned, adopted when its `send` went through. The first sync ships everything (the
//! bridge cannot know what the engines serve); so does the sync after a failed `send` (an
//! engine may hold part of it). What an engine did with a complete send is its own report:
//! one that refused it (a digest mismatch) keeps refusing deltas until a full sync, which
//! this bridge does not ask for — the host stops the run on a failed sync.

use std::sync::{Mutex, MutexGuard};

use crate::changes::{self, Fingerprints};
use crate::region::Mapped;
use tandem_plugin_api::sdk::{BridgeImpl, Result, buckets};
use tandem_plugin_api::{
    BRIDGE_GROUP, BridgePlan, HostBox, LogLevel, PluginError, RSliceMut, RStr, RVec, TensorSpec,
    UpdateKind, UpdatePayload, WeightUpdate,
};

/// The `delta` bridge, one instance per process (only the trainer's instance keeps state).
pub(crate) struct Delta {
    host: HostBox,
    bucket_bytes: u64,
    state: Mutex<Sender>,
}

/// What the trainer half keeps between its calls.
#[derive(Default)]
struct Sender {
    /// The region's key and its layout, as the trainer's first export of it carried.
    layout: Option<(String, RVec<TensorSpec>)>,
    /// The region mapped in this process (kept across syncs).
    mapped: Option<Mapped>,
    /// Fingerprints of what the engines were last sent (empty: nothing known).
    synced: Fingerprints,
    /// The last plan, until its `send` goes through.
    planned: Option<Planned>,
}

/// A manifest the trainer half returned and `send` has not yet sent.
struct Planned {
    version: u64,
    starts: Vec<u64>,
    fingerprints: Fingerprints,
}

impl Delta {
    pub(crate) fn new(host: HostBox, bucket_bytes: u64) -> Delta {
        Delta {
            host,
            bucket_bytes,
            state: Mutex::new(Sender::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, Sender> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log(&self, message: &str) {
        self.host
            .log(LogLevel::Info, "delta".into(), RStr::from(message));
    }
}

/// `update` if it is of `kind`, else one error naming the side.
fn expect_kind(kind: UpdateKind, update: WeightUpdate, side: &str) -> Result<WeightUpdate> {
    let got = update.payload.kind();
    if got == kind {
        return Ok(update);
    }
    Err(PluginError::invalid_input(format!(
        "delta bridge ({side}): got a `{}` update, it takes `{}`",
        got.as_str(),
        kind.as_str()
    ))
    .with_help("the trainer must export shared_region updates and the engine apply tensor_buckets"))
}

impl BridgeImpl for Delta {
    fn trainer_side(&self, exported: WeightUpdate) -> Result<WeightUpdate> {
        let exported = expect_kind(UpdateKind::SharedRegion, exported, "trainer side")?;
        let UpdatePayload::SharedRegion { region, tensors } = exported.payload else {
            return Err(PluginError::runtime(
                "delta bridge: the kind check let through another kind",
            ));
        };
        let key = region.key.to_string();
        let mut guard = self.state();
        let state = &mut *guard;
        // Dropped first: a plan the host never sent is no baseline.
        state.planned = None;
        if !tensors.is_empty() {
            state.layout = Some((key.clone(), tensors));
        }
        let layout = match &state.layout {
            Some((k, t)) if *k == key => t,
            _ => {
                return Err(PluginError::invalid_state(format!(
                    "delta bridge: the trainer exported region {key} without its tensor \
                     layout, and this bridge never received it"
                ))
                .with_help("a trainer sends the layout with its first export of a region"));
            }
        };
        if state.mapped.as_ref().is_some_and(|m| m.key != key) {
            state.mapped = None;
        }
        let mapped = match &mut state.mapped {
            Some(m) => m,
            slot => slot.insert(Mapped::attach(&self.host, &key)?),
        };
        if mapped.len() < region.len {
            return Err(PluginError::invalid_input(format!(
                "delta bridge: region {key} is exported as {} bytes, but {} are mapped",
                region.len,
                mapped.len()
            )));
        }
        let bytes = &mapped.bytes()[..region.len as usize];
        let delta = changes::delta(layout, bytes, &state.synced, self.bucket_bytes)?;
        self.log(&format!(
            "delta bridge: v{} ships {} of {} tensors, {} of {} bytes, in {} buckets{}",
            exported.version,
            delta.shipped_tensors,
            delta.total_tensors,
            delta.shipped_bytes,
            delta.total_bytes,
            delta.buckets.len(),
            if state.synced.is_empty() {
                " (first sync: everything)"
            } else {
                ""
            }
        ));
        state.planned = Some(Planned {
            version: exported.version,
            starts: delta.starts,
            fingerprints: delta.fingerprints,
        });
        Ok(WeightUpdate {
            version: exported.version,
            digest: exported.digest,
            payload: UpdatePayload::TensorBuckets {
                group: BRIDGE_GROUP.into(),
                buckets: RVec::from(delta.buckets),
            },
        })
    }

    fn send(&self, shipped: WeightUpdate) -> Result<()> {
        let UpdatePayload::TensorBuckets {
            group,
            buckets: manifest,
        } = &shipped.payload
        else {
            return Err(PluginError::invalid_input(format!(
                "delta bridge: `send` got a `{}` update; it takes the manifest its trainer half \
                 returned",
                shipped.payload.kind().as_str()
            )));
        };
        let mut guard = self.state();
        let state = &mut *guard;
        let planned = match state.planned.take() {
            Some(p) if p.version == shipped.version && p.starts.len() == manifest.len() => p,
            other => {
                let last = other.map_or("nothing".to_owned(), |p| {
                    format!("v{} ({} buckets)", p.version, p.starts.len())
                });
                return Err(PluginError::invalid_state(format!(
                    "delta bridge: asked to send v{} ({} buckets), but the trainer half last \
                     planned {last}",
                    shipped.version,
                    manifest.len()
                )));
            }
        };
        let Some(mapped) = state.mapped.as_mut() else {
            return Err(PluginError::invalid_state(
                "delta bridge: `send` before the trainer half mapped a region",
            ));
        };
        let group = RStr::from(group.as_str());
        for (k, (bucket, &start)) in manifest.iter().zip(&planned.starts).enumerate() {
            let sent = mapped.send_buffer(start, bucket.bytes).and_then(|data| {
                let mut trailer = buckets::trailer(data, shipped.version, k as u32);
                self.host
                    .broadcast(group, 0, RSliceMut::from_mut_slice(data))
                    .into_result()?;
                self.host
                    .broadcast(group, 0, RSliceMut::from_mut_slice(&mut trailer))
                    .into_result()
            });
            if let Err(e) = sent {
                // An engine may hold part of this version: the next sync ships everything.
                state.synced.clear();
                return Err(PluginError::new(
                    e.code,
                    format!(
                        "delta bridge: sending bucket {k} of {} (v{}, {} bytes) failed: {}",
                        manifest.len(),
                        shipped.version,
                        bucket.bytes,
                        e.message
                    ),
                )
                .with_help(e.help.as_str()));
            }
        }
        state.synced = planned.fingerprints;
        Ok(())
    }

    fn engine_side(&self, shipped: WeightUpdate) -> Result<WeightUpdate> {
        expect_kind(UpdateKind::TensorBuckets, shipped, "engine side")
    }

    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan {
            transport: true,
            ..BridgePlan::default()
        })
    }
}
