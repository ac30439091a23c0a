//! What a bridge's halves hand each other at API level
//! [`BRIDGE_IO`](crate::api_level::BRIDGE_IO): the [`Shipment`] the trainer half returns
//! (a standard update, placed buckets, or a payload the bridge owns), what the engine half
//! hands its engine ([`Received`]), each side's resident tags ([`ResidentTags`]) and the
//! outcome of an apply ([`ApplyOutcome`]).
//!
//! The host moves a shipment from the trainer's process to every engine's and reads only
//! its version and digest (checked against every engine's report) and its byte accounting
//! ([`Shipment::wire_bytes`]); a [`ShipmentBody::Owned`] payload is never interpreted.

use abi_stable::StableAbi;
use abi_stable::std_types::{RString, RVec};
use serde::{Deserialize, Serialize};

use super::update::{TensorBucket, UpdatePayload, WeightUpdate};

/// A bucket of the sender's tensor stream and where it starts in that stream (e.g. its byte
/// offset in the trainer's weights region), so a receiver other than the engine can place it.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PlacedBucket {
    /// Byte offset of the bucket's first byte in the sender's stream.
    pub start: u64,
    /// The bucket (tensor offsets relative to its first byte).
    pub bucket: TensorBucket,
}

/// What travels from the trainer half to the engine halves.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ShipmentBody {
    /// A standard update (a region key, an adapter, a checkpoint dir, a bucket manifest
    /// without starts).
    Update(UpdatePayload),
    /// Buckets of the trainer's tensor stream the trainer half's `transmit` sends over
    /// `group`, in this order.
    Buckets {
        /// The transport group the buckets travel on.
        group: RString,
        /// The buckets, in send order, each with its start.
        buckets: RVec<PlacedBucket>,
    },
    /// The bridge's own payload: bytes the host hands every engine half unread (e.g. a frame
    /// list), and the bridge's own accounting of what it moves.
    Owned {
        /// The bridge's bytes.
        #[serde(with = "crate::wire::bytes")]
        data: RVec<u8>,
        /// Bytes the bridge puts on the wire to each engine for this sync (as it counts
        /// them; the host records them, never checks them).
        wire_bytes: u64,
    },
}

/// A shipment: what the trainer half returns, with the exported weights' version and digest.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Shipment {
    /// Weight version; only ever goes up.
    pub version: u64,
    /// Digest of the weights the engines must serve after applying it (empty: not computed).
    pub digest: RString,
    /// What travels.
    pub body: ShipmentBody,
}

impl Shipment {
    /// A standard update as a shipment.
    pub fn from_update(update: WeightUpdate) -> Shipment {
        Shipment {
            version: update.version,
            digest: update.digest,
            body: ShipmentBody::Update(update.payload),
        }
    }

    /// The shipment as a standard update: placed buckets lose their starts; a payload the
    /// bridge owns has no such form (`None`).
    pub fn to_update(&self) -> Option<WeightUpdate> {
        let payload = match &self.body {
            ShipmentBody::Update(p) => p.clone(),
            ShipmentBody::Buckets { group, buckets } => UpdatePayload::TensorBuckets {
                group: group.clone(),
                buckets: buckets.iter().map(|b| b.bucket.clone()).collect(),
            },
            ShipmentBody::Owned { .. } => return None,
        };
        Some(WeightUpdate {
            version: self.version,
            payload,
            digest: self.digest.clone(),
        })
    }

    /// Lower-case name of what it carries, for messages (`shipment of checkpoint_dir`, …).
    pub fn kind_name(&self) -> &'static str {
        match &self.body {
            ShipmentBody::Update(p) => p.kind().as_str(),
            ShipmentBody::Buckets { .. } => "placed_buckets",
            ShipmentBody::Owned { .. } => "bridge_owned",
        }
    }

    /// Bytes this shipment carries to each engine over the wire, when the shipment itself
    /// says (buckets: their bytes; an owned payload: the bridge's count); `None` for a
    /// standard update (the host measures it: the files each engine reads, nothing for a
    /// shared region).
    pub fn wire_bytes(&self) -> Option<u64> {
        match &self.body {
            ShipmentBody::Update(UpdatePayload::TensorBuckets { buckets, .. }) => {
                Some(buckets.iter().map(|b| b.bytes).sum())
            }
            ShipmentBody::Update(_) => None,
            ShipmentBody::Buckets { buckets, .. } => {
                Some(buckets.iter().map(|b| b.bucket.bytes).sum())
            }
            ShipmentBody::Owned { wire_bytes, .. } => Some(*wire_bytes),
        }
    }
}

/// What the engine half hands its engine.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Received {
    /// An update the engine applies with `apply_weight_update`, as at API level 4.
    Apply(WeightUpdate),
    /// The engine half gave the decoded tensors to the sink it was handed
    /// ([`TensorSink`](crate::traits::TensorSink)); the engine copied them into the weights
    /// it serves. Returned after the last bucket was put.
    Decoded,
}

/// Memory tags a bridge keeps resident, per side (e.g. `weights` on the engines only, when
/// the engines' copies are the baseline of the next sync).
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ResidentTags {
    /// Tags the trainer may not offload while the bridge is in use.
    pub trainer: RVec<RString>,
    /// Tags the engines may not release while the bridge is in use.
    pub engines: RVec<RString>,
}

/// How an apply ended, as a bridge half learns it after the fact.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ApplyOutcome {
    /// The shipment's version.
    pub version: u64,
    /// In an engine's process: this engine applied the shipment (its apply returned a
    /// report). In the trainer's process: every engine applied it and the host verified
    /// every engine's version and digest. `false`: something failed; an engine may hold
    /// part of it.
    pub applied: bool,
}
