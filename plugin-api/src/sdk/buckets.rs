//! Bucketed weight transfer over the transport: the wire format a sending bridge and a
//! receiving engine share (API level [`BRIDGE`](crate::api_level::BRIDGE)).
//!
//! An `UpdatePayload::TensorBuckets { group, buckets }` update lists the buckets in send
//! order; bucket `k` covers `buckets[k].bytes` bytes of the sender's tensor stream and lists
//! the (whole) tensors in it, offsets relative to the bucket's first byte. On the group the
//! root broadcasts, for each bucket, its data (exactly `bytes` bytes) and then a
//! [`TRAILER_BYTES`]-byte trailer: magic, bucket index, weight version, length and an XXH3-64
//! checksum of the data. A receiver takes each bucket into a buffer it allocated once,
//! [`check`]s the trailer, and only then copies the bucket's tensors into the weights it
//! serves: a corrupt, short or out-of-order bucket is never copied.
//!
//! [`plan`] cuts a tensor layout into buckets the way slime and verl do: whole tensors, in
//! layout order, a bucket closed before it would exceed the bucket size (a tensor larger than
//! the bucket size travels alone).

use crate::error::PluginError;
use crate::types::{Received, Shipment, ShipmentBody, TensorBucket, TensorSpec, UpdatePayload};
use abi_stable::std_types::RVec;

/// Bytes of the trailer that follows each bucket's data on the wire.
pub const TRAILER_BYTES: usize = 32;

const MAGIC: u32 = u32::from_le_bytes(*b"TBK1");

/// Bytes of one tensor: element size times its element count.
pub fn tensor_bytes(t: &TensorSpec) -> u64 {
    t.shape.iter().product::<u64>() * t.dtype.size() as u64
}

/// Cuts `layout` (offsets in one stream, e.g. a region) into buckets of at most
/// `bucket_bytes` (whole tensors, in offset order). Bucket `k`'s data is the stream range
/// from its first tensor's offset to its last tensor's end; its tensors' offsets are
/// relative to that start. Returns the buckets and each one's start in the stream.
pub fn plan(layout: &[TensorSpec], bucket_bytes: u64) -> (Vec<TensorBucket>, Vec<u64>) {
    let mut order: Vec<&TensorSpec> = layout.iter().collect();
    order.sort_by_key(|t| t.offset);
    let mut buckets = Vec::new();
    let mut starts = Vec::new();
    let mut current: Vec<TensorSpec> = Vec::new();
    let mut start = 0u64;
    let mut close = |current: &mut Vec<TensorSpec>, start: u64| {
        if let Some(last) = current.last() {
            let bytes = last.offset + tensor_bytes(last);
            buckets.push(TensorBucket {
                tensors: RVec::from(std::mem::take(current)),
                bytes,
            });
            starts.push(start);
        }
    };
    for t in order {
        let end = t.offset + tensor_bytes(t);
        if !current.is_empty() && end - start > bucket_bytes {
            close(&mut current, start);
        }
        if current.is_empty() {
            start = t.offset;
        }
        let mut rel = t.clone();
        rel.offset = t.offset - start;
        current.push(rel);
    }
    close(&mut current, start);
    (buckets, starts)
}

/// The checksum the trailer carries.
fn checksum(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

/// The trailer of bucket `index` of weight version `version` whose data is `data`.
pub fn trailer(data: &[u8], version: u64, index: u32) -> [u8; TRAILER_BYTES] {
    let mut t = [0u8; TRAILER_BYTES];
    t[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    t[4..8].copy_from_slice(&index.to_le_bytes());
    t[8..16].copy_from_slice(&version.to_le_bytes());
    t[16..24].copy_from_slice(&(data.len() as u64).to_le_bytes());
    t[24..32].copy_from_slice(&checksum(data).to_le_bytes());
    t
}

fn word(t: &[u8; TRAILER_BYTES], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&t[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Checks that `data` is bucket `index` of version `version`, whole and unchanged, as the
/// sender's `trailer` says. The error names what differs.
pub fn check(
    data: &[u8],
    trailer: &[u8; TRAILER_BYTES],
    version: u64,
    index: u32,
) -> Result<(), PluginError> {
    let bad = |what: String| {
        Err(PluginError::new(
            crate::ErrorCode::Corrupt,
            format!("weight bucket {index} of v{version}: {what}; it was not applied"),
        ))
    };
    let mut m = [0u8; 4];
    m.copy_from_slice(&trailer[0..4]);
    if u32::from_le_bytes(m) != MAGIC {
        return bad("the trailer is not a bucket trailer (stream out of step)".into());
    }
    let mut i = [0u8; 4];
    i.copy_from_slice(&trailer[4..8]);
    let (got_index, got_version, len) =
        (u32::from_le_bytes(i), word(trailer, 8), word(trailer, 16));
    if got_index != index || got_version != version {
        return bad(format!(
            "the sender sent bucket {got_index} of v{got_version} in its place"
        ));
    }
    if len != data.len() as u64 {
        return bad(format!(
            "{} bytes expected, the sender sent {len}",
            data.len()
        ));
    }
    if checksum(data) != word(trailer, 24) {
        return bad("its checksum does not match the sender's (damaged in transit)".into());
    }
    Ok(())
}

/// The engine half of a bridge whose engines receive its buckets themselves (`broadcast`,
/// `delta`): placed buckets, or a `tensor_buckets` update, go to the engine's
/// `apply_weight_update` as a `tensor_buckets` update; any other shipment is refused, naming
/// `bridge`.
pub fn to_engine(bridge: &str, shipment: Shipment) -> Result<Received, PluginError> {
    let update = match &shipment.body {
        ShipmentBody::Buckets { .. }
        | ShipmentBody::Update(UpdatePayload::TensorBuckets { .. }) => shipment.to_update(),
        _ => None,
    };
    update.map(Received::Apply).ok_or_else(|| {
        PluginError::invalid_input(format!(
            "{bridge} bridge (engine side): got a shipment of {}, it takes placed_buckets",
            shipment.kind_name()
        ))
        .with_help("the engines receive the buckets the trainer half ships")
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::types::DType;

    fn spec(name: &str, n: u64, offset: u64) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype: DType::F32,
            shape: RVec::from(vec![n]),
            offset,
        }
    }

    #[test]
    fn plan_keeps_tensors_whole_in_order_and_within_the_bucket_size() {
        let layout = [
            spec("b", 10, 40),
            spec("a", 10, 0),
            spec("big", 100, 80),
            spec("c", 1, 480),
        ];
        let (buckets, starts) = plan(&layout, 64);
        let names: Vec<Vec<&str>> = buckets
            .iter()
            .map(|b| b.tensors.iter().map(|t| t.name.as_str()).collect())
            .collect();
        assert_eq!(names, [vec!["a"], vec!["b"], vec!["big"], vec!["c"]]);
        assert_eq!(starts, [0, 40, 80, 480]);
        assert_eq!(
            buckets[2].bytes, 400,
            "a tensor larger than a bucket travels alone"
        );
        let (one, _) = plan(&layout, 1 << 20);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].bytes, 484);
        assert_eq!(one[0].tensors[3].offset, 480);
    }

    #[test]
    fn check_refuses_every_kind_of_damage() {
        let data: Vec<u8> = (0..=255).collect();
        let t = trailer(&data, 7, 3);
        assert!(check(&data, &t, 7, 3).is_ok());
        assert!(check(&data, &t, 8, 3).is_err(), "another version");
        assert!(check(&data, &t, 7, 2).is_err(), "another bucket");
        assert!(check(&data[..255], &t, 7, 3).is_err(), "short");
        let mut flipped = data.clone();
        flipped[100] ^= 1;
        let e = check(&flipped, &t, 7, 3).unwrap_err();
        assert!(e.message.contains("checksum"), "{e}");
        assert!(
            check(&data, &[0u8; TRAILER_BYTES], 7, 3).is_err(),
            "no trailer"
        );
    }
}
