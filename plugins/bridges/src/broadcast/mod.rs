//! `broadcast`: the trainer's weights streamed in buckets over the transport, the way slime
//! and verl sync weights over NCCL, to every engine rank at once.
//!
//! - Trainer half (`trainer_side`, trainer process): the trainer exports its weights region
//!   (`SharedRegion`: key + layout, no copy); the half cuts the layout into buckets of whole
//!   tensors ([`sdk::buckets::plan`], `bucket_mb`) and ships a `TensorBuckets` manifest on the
//!   group [`BRIDGE_GROUP`] with the trainer's version and digest.
//! - `send` (trainer process, while the engines apply): for each bucket, one broadcast of its
//!   bytes straight from the mapped region (no staging copy) and one of its trailer (index,
//!   version, length, XXH3 checksum). Trainer rank 0 sends everything: the native trainer
//!   holds whole weights on every rank, and one root keeps the engines' receive order simple;
//!   a sharded trainer would gather per bucket first.
//! - Engine half: the manifest goes to the engine's `apply_weight_update`, which receives each
//!   bucket into one preallocated buffer, checks its trailer and copies it into the served
//!   weights in place, then checks the digest (`sdk::buckets` describes the wire format).
//!
//! The transport underneath is the host's: shm between processes on one machine, TCP between
//! machines, NCCL on GPU (`[transport] backend`).

mod region;

use std::sync::Mutex;

use crate::passthrough::expect_kind;
use region::Mapped;
use tandem_plugin_api::sdk::BridgeImpl;
use tandem_plugin_api::sdk::{Result, buckets};
use tandem_plugin_api::{
    BRIDGE_GROUP, BridgePlan, HostBox, PluginError, RSliceMut, RStr, RVec, TensorSpec, UpdateKind,
    UpdatePayload, WeightUpdate,
};

/// The `broadcast` bridge, one instance per process.
pub(crate) struct Broadcast {
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
    /// The stream offset of each bucket of the last manifest, and its version.
    starts: Vec<u64>,
    version: u64,
}

impl Broadcast {
    pub(crate) fn new(host: HostBox, bucket_bytes: u64) -> Broadcast {
        Broadcast {
            host,
            bucket_bytes,
            state: Mutex::new(Sender::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Sender> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl BridgeImpl for Broadcast {
    fn trainer_side(&self, exported: WeightUpdate) -> Result<WeightUpdate> {
        let exported = expect_kind(
            "broadcast",
            UpdateKind::SharedRegion,
            exported,
            "trainer side",
        )?;
        let UpdatePayload::SharedRegion { region, tensors } = exported.payload else {
            unreachable!("checked by expect_kind");
        };
        let key = region.key.to_string();
        let mut state = self.state();
        if !tensors.is_empty() {
            state.layout = Some((key.clone(), tensors));
        }
        let layout = match &state.layout {
            Some((k, t)) if *k == key => t.clone(),
            _ => {
                return Err(PluginError::invalid_state(format!(
                    "broadcast bridge: the trainer exported region {key} without its tensor \
                     layout, and this bridge never received it"
                ))
                .with_help("a trainer sends the layout with its first export of a region"));
            }
        };
        if let Some(end) = layout
            .iter()
            .map(|t| t.offset + buckets::tensor_bytes(t))
            .max()
            && end > region.len
        {
            return Err(PluginError::invalid_input(format!(
                "broadcast bridge: the layout ends at byte {end}, past region {key} ({} bytes)",
                region.len
            )));
        }
        let (planned, starts) = buckets::plan(&layout, self.bucket_bytes);
        if state.mapped.as_ref().is_some_and(|m| m.key != key) {
            state.mapped = None;
        }
        state.starts = starts;
        state.version = exported.version;
        Ok(WeightUpdate {
            version: exported.version,
            digest: exported.digest,
            payload: UpdatePayload::TensorBuckets {
                group: BRIDGE_GROUP.into(),
                buckets: RVec::from(planned),
            },
        })
    }

    fn send(&self, shipped: WeightUpdate) -> Result<()> {
        let UpdatePayload::TensorBuckets {
            group,
            buckets: manifest,
        } = &shipped.payload
        else {
            return Err(PluginError::invalid_input(
                "broadcast bridge: `send` takes the manifest its trainer half returned",
            ));
        };
        let mut state = self.state();
        if state.version != shipped.version || state.starts.len() != manifest.len() {
            return Err(PluginError::invalid_state(format!(
                "broadcast bridge: asked to send v{} ({} buckets), but the trainer half last \
                 planned v{} ({} buckets)",
                shipped.version,
                manifest.len(),
                state.version,
                state.starts.len()
            )));
        }
        if state.mapped.is_none() {
            let key = match &state.layout {
                Some((k, _)) => k.clone(),
                None => return Err(PluginError::invalid_state("broadcast bridge: no region")),
            };
            state.mapped = Some(Mapped::attach(&self.host, &key)?);
        }
        let starts = state.starts.clone();
        let Some(mapped) = state.mapped.as_mut() else {
            return Err(PluginError::invalid_state("broadcast bridge: no region"));
        };
        let group = RStr::from(group.as_str());
        let n = manifest.len();
        // Each bucket's checksum is taken while the bucket before it is on the wire: the
        // sender never leaves the receivers idle while it hashes.
        let mut trailer = match manifest.first() {
            Some(b) => buckets::trailer(mapped.bytes(starts[0], b.bytes)?, shipped.version, 0),
            None => return Ok(()),
        };
        for k in 0..n {
            let next = (k + 1 < n).then(|| (starts[k + 1], manifest[k + 1].bytes));
            let (data, following) = mapped.split((starts[k], manifest[k].bytes), next)?;
            let (sent, next_trailer) = std::thread::scope(|s| {
                let hashing = following
                    .map(|f| s.spawn(move || buckets::trailer(f, shipped.version, k as u32 + 1)));
                let sent = self
                    .host
                    .broadcast(group, 0, RSliceMut::from_mut_slice(data))
                    .into_result();
                (sent, hashing.map(|h| h.join()))
            });
            sent.map_err(|e| sent_failed(k, n, e))?;
            self.host
                .broadcast(group, 0, RSliceMut::from_mut_slice(&mut trailer))
                .into_result()
                .map_err(|e| sent_failed(k, n, e))?;
            match next_trailer {
                Some(Ok(t)) => trailer = t,
                Some(Err(_)) => {
                    return Err(PluginError::runtime(
                        "broadcast bridge: the checksum thread panicked",
                    ));
                }
                None => {}
            }
        }
        Ok(())
    }

    fn engine_side(&self, shipped: WeightUpdate) -> Result<WeightUpdate> {
        expect_kind(
            "broadcast",
            UpdateKind::TensorBuckets,
            shipped,
            "engine side",
        )
    }

    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan {
            transport: true,
            ..BridgePlan::default()
        })
    }
}

fn sent_failed(k: usize, n: usize, e: PluginError) -> PluginError {
    let mut out = PluginError::new(
        e.code,
        format!(
            "broadcast bridge: sending bucket {k} of {n} failed: {}",
            e.message
        ),
    );
    out.help = e.help;
    out
}
