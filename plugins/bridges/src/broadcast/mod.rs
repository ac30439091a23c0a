//! `broadcast`: the trainer's weights streamed in buckets over the transport, the way slime
//! and verl sync weights over NCCL, to every engine rank at once (API level 7 calls only).
//!
//! - `ship` (trainer process): the trainer exports its weights region (`SharedRegion`: key +
//!   layout, no copy); the half cuts the layout into buckets of whole tensors
//!   ([`sdk::buckets::plan`], `bucket_mb`) and ships them as placed buckets (each with its
//!   byte offset in the region) on the group [`BRIDGE_GROUP`] with the trainer's version and
//!   digest.
//! - `transmit` (trainer process, while the engines receive): checks the placed buckets
//!   against the layout and the region ([`wire::check_placed`]), then sends each bucket's
//!   bytes straight from the mapped region ([`Region`], no staging copy) and its trailer
//!   (index, version, length, XXH3 checksum) ([`wire::send`]). Trainer rank 0 sends
//!   everything: the native trainer holds whole weights on every rank, and one root keeps the
//!   engines' receive order simple; a sharded trainer would gather per bucket first.
//! - `receive` (engine process): the buckets, without their starts, go to the engine's
//!   `apply_weight_update` ([`Received::Apply`]), which receives each bucket into one
//!   preallocated buffer, checks its trailer and copies it into the served weights in place,
//!   then checks the digest (`sdk::buckets` describes the wire format).
//! - `stats` (trainer process): since the last call, `buckets` and `wire_bytes` sent (data
//!   and trailers), seconds in `ship` (`ship_s`) and in `transmit` (`transmit_s`). The
//!   engine half has none.
//!
//! The transport underneath is the host's: shm between processes on one machine, TCP between
//! machines, NCCL on GPU (`[transport] backend`).

mod wire;

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::passthrough::expect_kind;
use tandem_plugin_api::sdk::region::Region;
use tandem_plugin_api::sdk::{BridgeImpl, Result, Sink, buckets};
use tandem_plugin_api::{
    BRIDGE_GROUP, BridgePlan, HostBox, Metric, PlacedBucket, PluginError, RVec, Received, Shipment,
    ShipmentBody, TensorSpec, UpdateKind, UpdatePayload, WeightUpdate,
};

/// The `broadcast` bridge, one instance per process (only the trainer's keeps state).
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
    region: Option<Region>,
    /// Figures since the last `stats`.
    counters: Counters,
}

/// What `stats` reports: the trainer half's figures since the last call.
#[derive(Default)]
struct Counters {
    /// Whether a trainer-half call ran since the last `stats` (else there is nothing to say).
    active: bool,
    buckets: u64,
    wire_bytes: u64,
    ship_s: f64,
    transmit_s: f64,
}

impl Broadcast {
    pub(crate) fn new(host: HostBox, bucket_bytes: u64) -> Broadcast {
        Broadcast {
            host,
            bucket_bytes,
            state: Mutex::new(Sender::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, Sender> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The trainer half's plan of `exported`, with the state locked.
    fn plan_buckets(&self, state: &mut Sender, exported: WeightUpdate) -> Result<Shipment> {
        let exported = expect_kind(
            "broadcast",
            UpdateKind::SharedRegion,
            exported,
            "trainer side",
        )?;
        let UpdatePayload::SharedRegion { region, tensors } = exported.payload else {
            return Err(PluginError::runtime(
                "broadcast bridge: the kind check let through another kind",
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
        let (planned, starts) = buckets::plan(layout, self.bucket_bytes);
        if state.region.as_ref().is_some_and(|r| r.key() != key) {
            state.region = None;
        }
        Ok(Shipment {
            version: exported.version,
            digest: exported.digest,
            body: ShipmentBody::Buckets {
                group: BRIDGE_GROUP.into(),
                buckets: planned
                    .into_iter()
                    .zip(starts)
                    .map(|(bucket, start)| PlacedBucket { start, bucket })
                    .collect(),
            },
        })
    }

    /// Sends `placed` of version `version`, with the state locked, counting what goes on
    /// the wire.
    fn send_placed(&self, state: &mut Sender, version: u64, placed: &[PlacedBucket]) -> Result<()> {
        let Sender {
            layout,
            region,
            counters,
        } = state;
        let Some((key, layout)) = layout else {
            return Err(PluginError::invalid_state(
                "broadcast bridge: `transmit` before `ship` saw the trainer's region",
            ));
        };
        let region = match region {
            Some(r) => r,
            slot => slot.insert(Region::attach(&self.host, key).map_err(prefixed)?),
        };
        wire::check_placed(layout, (region.key(), region.len()), placed)?;
        wire::send(&self.host, region, version, placed, counters)
    }
}

/// `e` with the bridge's name in front.
fn prefixed(e: PluginError) -> PluginError {
    PluginError::new(e.code, format!("broadcast bridge: {}", e.message)).with_help(e.help.as_str())
}

impl BridgeImpl for Broadcast {
    fn ship(&self, exported: WeightUpdate) -> Result<Shipment> {
        let began = Instant::now();
        let mut state = self.state();
        let shipped = self.plan_buckets(&mut state, exported);
        state.counters.active = true;
        state.counters.ship_s += began.elapsed().as_secs_f64();
        shipped
    }

    fn transmit(&self, shipment: Shipment) -> Result<()> {
        let began = Instant::now();
        let ShipmentBody::Buckets { group, buckets } = &shipment.body else {
            return Err(PluginError::invalid_input(format!(
                "broadcast bridge: `transmit` got a shipment of {}; it takes the placed buckets \
                 its `ship` returned",
                shipment.kind_name()
            )));
        };
        if group.as_str() != BRIDGE_GROUP {
            return Err(PluginError::invalid_input(format!(
                "broadcast bridge: `transmit` got buckets for group `{group}`; its `ship` \
                 places them on `{BRIDGE_GROUP}`"
            )));
        }
        let mut state = self.state();
        let sent = self.send_placed(&mut state, shipment.version, buckets);
        state.counters.active = true;
        state.counters.transmit_s += began.elapsed().as_secs_f64();
        sent
    }

    fn receive(&self, shipment: Shipment, _sink: &mut Sink) -> Result<Received> {
        buckets::to_engine("broadcast", shipment)
    }

    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan {
            transport: true,
            ..BridgePlan::default()
        })
    }

    fn stats(&self) -> Result<Vec<Metric>> {
        let c = std::mem::take(&mut self.state().counters);
        if !c.active {
            return Ok(Vec::new());
        }
        Ok(vec![
            Metric::new("buckets", c.buckets as f64),
            Metric::new("wire_bytes", c.wire_bytes as f64),
            Metric::new("ship_s", c.ship_s),
            Metric::new("transmit_s", c.transmit_s),
        ])
    }
}
