//! `delta`: the bridge's halves (API level 7 calls only).
//!
//! - `ship` (trainer process): takes the trainer's `SharedRegion` export (key + tensor
//!   layout; later exports of the same region carry no layout, so the one seen first is
//!   kept), maps the region ([`Region`]), fingerprints every tensor and ships the changed ones
//!   ([`changes`](crate::changes)) as placed buckets (each with its byte offset in the
//!   region) on [`BRIDGE_GROUP`] with the export's version and digest. The digest covers the
//!   full weights: each engine checks its full served weights against it after the last
//!   bucket, so a delta against weights an engine does not hold is refused, never served.
//! - `transmit` (trainer process, while every engine receives): checks the shipment is the
//!   one planned (version, bucket count) and its buckets lie in the region, then for each
//!   bucket broadcasts its bytes straight from the mapped region, then its 32-byte trailer
//!   ([`buckets::trailer`]). The region is only read.
//! - `receive` (engine process): hands the buckets, without their starts, to the engine's
//!   `apply_weight_update` ([`Received::Apply`]), which receives them.
//! - `after_apply` (trainer process): adopts the planned fingerprints as the baseline of the
//!   next delta when every engine applied the planned version and was verified; any other
//!   outcome clears the baseline.
//! - `stats` (trainer process): since the last call, `shipped_tensors`, `shipped_bytes` and
//!   `total_bytes` (of the layout) planned, seconds in `ship` (`ship_s`) and in `transmit`
//!   (`transmit_s`). The engine half has none.
//!
//! The baseline is what every engine is known to serve. The first sync ships everything (the
//! bridge cannot know what the engines serve); so does the sync after a failed transmit or a
//! failed apply (an engine may hold part of it), and after a plan that was transmitted but
//! whose outcome never came. A plan never transmitted leaves the baseline as it was.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::changes::{self, Fingerprints};
use tandem_plugin_api::sdk::region::Region;
use tandem_plugin_api::sdk::{BridgeImpl, Result, Sink, buckets};
use tandem_plugin_api::{
    ApplyOutcome, BRIDGE_GROUP, BridgePlan, HostBox, LogLevel, Metric, PlacedBucket, PluginError,
    RSliceMut, RStr, RString, RVec, Received, ResidentTags, Shipment, ShipmentBody, TensorSpec,
    UpdateKind, UpdatePayload, WeightUpdate, tags,
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
    region: Option<Region>,
    /// Fingerprints of what every engine serves (empty: nothing known).
    synced: Fingerprints,
    /// The last plan, until its outcome comes (`after_apply`).
    planned: Option<Planned>,
    /// Figures since the last `stats`.
    counters: Counters,
}

/// A shipment `ship` returned whose outcome has not come yet.
struct Planned {
    version: u64,
    buckets: usize,
    fingerprints: Fingerprints,
    /// Whether `transmit` started on it (an engine may hold part of it).
    transmitted: bool,
}

/// The trainer half's figures since the last `stats` (`active`: a call ran since).
#[derive(Default)]
struct Counters {
    active: bool,
    shipped_tensors: u64,
    shipped_bytes: u64,
    total_bytes: u64,
    ship_s: f64,
    transmit_s: f64,
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

    /// The delta of `exported` against the baseline, planned (state locked).
    fn plan_delta(&self, state: &mut Sender, exported: WeightUpdate) -> Result<Shipment> {
        let exported = expect_kind(UpdateKind::SharedRegion, exported, "trainer side")?;
        let UpdatePayload::SharedRegion { region, tensors } = exported.payload else {
            return Err(PluginError::runtime(
                "delta bridge: the kind check let through another kind",
            ));
        };
        let key = region.key.to_string();
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
        if state.region.as_ref().is_some_and(|r| r.key() != key) {
            state.region = None;
        }
        let mapped = match &mut state.region {
            Some(r) => r,
            slot => slot.insert(Region::attach(&self.host, &key).map_err(|e| {
                PluginError::new(e.code, format!("delta bridge: {}", e.message))
                    .with_help(e.help.as_str())
            })?),
        };
        if mapped.len() < region.len {
            return Err(PluginError::invalid_input(format!(
                "delta bridge: region {key} is exported as {} bytes, but {} are mapped",
                region.len,
                mapped.len()
            )));
        }
        let bytes = mapped.range(0, region.len)?;
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
        let c = &mut state.counters;
        c.shipped_tensors += delta.shipped_tensors as u64;
        c.shipped_bytes += delta.shipped_bytes;
        c.total_bytes += delta.total_bytes;
        state.planned = Some(Planned {
            version: exported.version,
            buckets: delta.buckets.len(),
            fingerprints: delta.fingerprints,
            transmitted: false,
        });
        Ok(Shipment {
            version: exported.version,
            digest: exported.digest,
            body: ShipmentBody::Buckets {
                group: BRIDGE_GROUP.into(),
                buckets: delta
                    .buckets
                    .into_iter()
                    .zip(delta.starts)
                    .map(|(bucket, start)| PlacedBucket { start, bucket })
                    .collect(),
            },
        })
    }

    /// Sends `placed`, the buckets of the planned version `version` (state locked).
    fn send_planned(
        &self,
        state: &mut Sender,
        version: u64,
        placed: &[PlacedBucket],
    ) -> Result<()> {
        let planned = match &mut state.planned {
            Some(p) if p.version == version && p.buckets == placed.len() => p,
            other => {
                let last = other.as_ref().map_or("nothing".to_owned(), |p| {
                    format!("v{} ({} buckets)", p.version, p.buckets)
                });
                return Err(PluginError::invalid_state(format!(
                    "delta bridge: asked to transmit v{version} ({} buckets), but the trainer \
                     half last planned {last}",
                    placed.len()
                )));
            }
        };
        let Some(region) = state.region.as_mut() else {
            return Err(PluginError::invalid_state(
                "delta bridge: `transmit` before the trainer half mapped a region",
            ));
        };
        check_inside(region, placed)?;
        planned.transmitted = true;
        let group = RStr::from(BRIDGE_GROUP);
        for (k, p) in placed.iter().enumerate() {
            let sent = region.range_mut(p.start, p.bucket.bytes).and_then(|data| {
                let mut trailer = buckets::trailer(data, version, k as u32);
                // The root of a broadcast only reads its buffer: the region is not written.
                self.host
                    .broadcast(group, 0, RSliceMut::from_mut_slice(data))
                    .into_result()?;
                self.host
                    .broadcast(group, 0, RSliceMut::from_mut_slice(&mut trailer))
                    .into_result()
            });
            if let Err(e) = sent {
                return Err(PluginError::new(
                    e.code,
                    format!(
                        "delta bridge: sending bucket {k} of {} (v{version}, {} bytes) failed: {}",
                        placed.len(),
                        p.bucket.bytes,
                        e.message
                    ),
                )
                .with_help(e.help.as_str()));
            }
        }
        Ok(())
    }
}

/// Checks, before anything is sent, that the buckets lie inside `region` in region order
/// without overlapping (a shipment that fails is refused whole).
fn check_inside(region: &Region, placed: &[PlacedBucket]) -> Result<()> {
    let mut end_before = 0u64;
    for (k, p) in placed.iter().enumerate() {
        match p.start.checked_add(p.bucket.bytes) {
            Some(end) if p.start >= end_before && end <= region.len() => end_before = end,
            _ => {
                return Err(PluginError::invalid_input(format!(
                    "delta bridge: bucket {k} of the shipment ({} bytes at byte {}) lies \
                     outside region {} ({} bytes) or overlaps the bucket before it",
                    p.bucket.bytes,
                    p.start,
                    region.key(),
                    region.len()
                ))
                .with_help("`transmit` takes the placed buckets this bridge's `ship` returned"));
            }
        }
    }
    Ok(())
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
    fn ship(&self, exported: WeightUpdate) -> Result<Shipment> {
        let began = Instant::now();
        let mut guard = self.state();
        let state = &mut *guard;
        // A plan whose outcome never came: if it was transmitted, an engine may hold part of
        // it, so nothing is known; if not, the baseline stands.
        if state.planned.take().is_some_and(|p| p.transmitted) {
            state.synced.clear();
        }
        let shipped = self.plan_delta(state, exported);
        state.counters.active = true;
        state.counters.ship_s += began.elapsed().as_secs_f64();
        shipped
    }

    fn transmit(&self, shipment: Shipment) -> Result<()> {
        let began = Instant::now();
        let ShipmentBody::Buckets { group, buckets } = &shipment.body else {
            return Err(PluginError::invalid_input(format!(
                "delta bridge: `transmit` got a shipment of {}; it takes the placed buckets its \
                 `ship` returned",
                shipment.kind_name()
            )));
        };
        if group.as_str() != BRIDGE_GROUP {
            return Err(PluginError::invalid_input(format!(
                "delta bridge: `transmit` got buckets for group `{group}`; its `ship` places \
                 them on `{BRIDGE_GROUP}`"
            )));
        }
        let mut guard = self.state();
        let state = &mut *guard;
        let sent = self.send_planned(state, shipment.version, buckets);
        if sent.is_err() && state.planned.as_ref().is_some_and(|p| p.transmitted) {
            // An engine may hold part of this version: the next sync ships everything.
            state.synced.clear();
        }
        state.counters.active = true;
        state.counters.transmit_s += began.elapsed().as_secs_f64();
        sent
    }

    fn receive(&self, shipment: Shipment, _sink: &mut Sink) -> Result<Received> {
        buckets::to_engine("delta", shipment)
    }

    fn after_apply(&self, outcome: ApplyOutcome) -> Result<()> {
        let mut guard = self.state();
        let state = &mut *guard;
        // In an engine's process nothing was planned and the baseline is empty: a no-op.
        state.synced = match state.planned.take() {
            Some(p) if outcome.applied && p.version == outcome.version => p.fingerprints,
            _ => Fingerprints::new(),
        };
        Ok(())
    }

    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan {
            transport: true,
            ..BridgePlan::default()
        })
    }

    /// The engines' weights stay resident: they are the baseline every delta is applied to,
    /// and an engine whose release discards its weights (vLLM's sleep level 2, SGLang's
    /// `release_memory_occupation`) would come back serving weights no delta describes. The
    /// trainer's may go: its half reads the region only between the export and the end of
    /// `transmit`, before the loop offloads the trainer.
    fn resident(&self) -> Result<ResidentTags> {
        Ok(ResidentTags {
            trainer: RVec::new(),
            engines: RVec::from(vec![RString::from(tags::WEIGHTS)]),
        })
    }

    fn stats(&self) -> Result<Vec<Metric>> {
        let c = std::mem::take(&mut self.state().counters);
        if !c.active {
            return Ok(Vec::new());
        }
        Ok(vec![
            Metric::new("shipped_tensors", c.shipped_tensors as f64),
            Metric::new("shipped_bytes", c.shipped_bytes as f64),
            Metric::new("total_bytes", c.total_bytes as f64),
            Metric::new("ship_s", c.ship_s),
            Metric::new("transmit_s", c.transmit_s),
        ])
    }
}
