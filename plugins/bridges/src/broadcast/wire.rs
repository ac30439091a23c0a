//! The `broadcast` bridge's `transmit` on the wire: the placed buckets checked against the
//! trainer's layout and region before a byte is sent ([`check_placed`]), then each bucket
//! broadcast straight from the region, followed by its trailer ([`send`]).

use std::collections::HashMap;

use super::Counters;
use tandem_plugin_api::sdk::region::Region;
use tandem_plugin_api::sdk::{Result, buckets};
use tandem_plugin_api::{
    BRIDGE_GROUP, HostBox, PlacedBucket, PluginError, RSliceMut, RStr, TensorSpec,
};

/// Checks that `placed` is what `ship` makes of `layout`: buckets in region order, not
/// overlapping, inside the region (`key`, `len` bytes), each tensor at its place in the
/// layout with its dtype and shape, inside its bucket. A shipment that fails is refused
/// whole, before anything is sent (a receiver never gets half a sync from a bad shipment).
pub(super) fn check_placed(
    layout: &[TensorSpec],
    (key, len): (&str, u64),
    placed: &[PlacedBucket],
) -> Result<()> {
    let by_name: HashMap<&str, &TensorSpec> = layout.iter().map(|t| (t.name.as_str(), t)).collect();
    let bad = |k: usize, what: String| {
        Err(PluginError::invalid_input(format!(
            "broadcast bridge: bucket {k} of the shipment {what}"
        ))
        .with_help("`transmit` takes the placed buckets this bridge's `ship` returned"))
    };
    let mut end_before = 0u64;
    for (k, p) in placed.iter().enumerate() {
        let end = p.start.checked_add(p.bucket.bytes);
        if end.is_none_or(|end| end > len) {
            return bad(
                k,
                format!(
                    "({} bytes at byte {}) lies outside region {key} ({len} bytes)",
                    p.bucket.bytes, p.start,
                ),
            );
        }
        if p.start < end_before {
            return bad(
                k,
                format!(
                    "starts at byte {}, inside the bucket before it (which ends at {end_before})",
                    p.start
                ),
            );
        }
        end_before = p.start + p.bucket.bytes;
        for t in p.bucket.tensors.iter() {
            let fits = t
                .offset
                .checked_add(buckets::tensor_bytes(t))
                .is_some_and(|e| e <= p.bucket.bytes);
            let placed_right = by_name.get(t.name.as_str()).is_some_and(|l| {
                l.offset == p.start + t.offset && l.dtype == t.dtype && l.shape == t.shape
            });
            if !fits || !placed_right {
                return bad(
                    k,
                    format!(
                        "places tensor `{}` at byte {} of the region, which is not where the \
                         trainer's layout has it",
                        t.name,
                        p.start.saturating_add(t.offset)
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Broadcasts each of `placed` (version `version`) from `region` as rank 0 of the bridge
/// group: its bytes, then its trailer. Each bucket's checksum is taken while the bucket
/// before it is on the wire, so the sender never leaves the receivers idle while it hashes.
/// Counts the buckets and bytes sent in `counters`, also when a later bucket fails.
pub(super) fn send(
    host: &HostBox,
    region: &mut Region,
    version: u64,
    placed: &[PlacedBucket],
    counters: &mut Counters,
) -> Result<()> {
    let group = RStr::from(BRIDGE_GROUP);
    let n = placed.len();
    let mut trailer = match placed.first() {
        Some(p) => buckets::trailer(region.range(p.start, p.bucket.bytes)?, version, 0),
        None => return Ok(()),
    };
    for k in 0..n {
        let this = (placed[k].start, placed[k].bucket.bytes);
        let (data, following) = match placed.get(k + 1) {
            Some(next) => {
                let (data, f) = region.split_mut(this, (next.start, next.bucket.bytes))?;
                (data, Some(f))
            }
            None => (region.range_mut(this.0, this.1)?, None),
        };
        let (sent, next_trailer) = std::thread::scope(|s| {
            let hashing =
                following.map(|f| s.spawn(move || buckets::trailer(f, version, k as u32 + 1)));
            let sent = host
                .broadcast(group, 0, RSliceMut::from_mut_slice(data))
                .into_result();
            (sent, hashing.map(|h| h.join()))
        });
        sent.map_err(|e| sent_failed(k, n, e))?;
        host.broadcast(group, 0, RSliceMut::from_mut_slice(&mut trailer))
            .into_result()
            .map_err(|e| sent_failed(k, n, e))?;
        counters.buckets += 1;
        counters.wire_bytes += this.1 + buckets::TRAILER_BYTES as u64;
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

fn sent_failed(k: usize, n: usize, e: PluginError) -> PluginError {
    PluginError::new(
        e.code,
        format!(
            "broadcast bridge: sending bucket {k} of {n} failed: {}",
            e.message
        ),
    )
    .with_help(e.help.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_plugin_api::{DType, RVec, TensorBucket};

    /// Tensors a..d of 4 f32 each (16 bytes), back to back from byte 0.
    fn layout() -> Vec<TensorSpec> {
        ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, n)| TensorSpec {
                name: (*n).into(),
                dtype: DType::F32,
                shape: RVec::from(vec![4]),
                offset: 16 * i as u64,
            })
            .collect()
    }

    /// What `ship` makes of the layout with `bucket_bytes`.
    fn shipped(bucket_bytes: u64) -> Vec<PlacedBucket> {
        let (planned, starts) = buckets::plan(&layout(), bucket_bytes);
        planned
            .into_iter()
            .zip(starts)
            .map(|(bucket, start)| PlacedBucket { start, bucket })
            .collect()
    }

    /// Why `placed` is refused; empty when it passes.
    fn refusal(placed: &[PlacedBucket]) -> String {
        match check_placed(&layout(), ("memfd:w", 64), placed) {
            Ok(()) => String::new(),
            Err(e) => e.message.to_string(),
        }
    }

    #[test]
    fn what_ship_places_passes() {
        for size in [16, 32, 48, 64] {
            let placed = shipped(size);
            assert_eq!(placed.len() as u64, 64_u64.div_ceil(size), "{size}");
            assert_eq!(refusal(&placed), "", "{size}");
        }
        assert_eq!(refusal(&[]), "");
    }

    #[test]
    fn a_bucket_out_of_place_is_refused_naming_it() {
        // Two buckets of two tensors, starts 0 and 32.
        let mut moved = shipped(32);
        moved[1].start = 16;
        let e = refusal(&moved);
        assert!(
            e.contains("bucket 1 of the shipment starts at byte 16"),
            "{e}"
        );

        let mut past = shipped(32);
        past[1].start = 48;
        let e = refusal(&past);
        assert!(
            e.contains("(32 bytes at byte 48) lies outside region memfd:w (64 bytes)"),
            "{e}"
        );

        let mut overflow = shipped(32);
        overflow[0].start = u64::MAX;
        assert!(refusal(&overflow).contains("outside region"));
    }

    #[test]
    fn a_tensor_not_where_the_layout_has_it_is_refused_naming_it() {
        let wrong = |edit: &dyn Fn(&mut TensorBucket)| {
            let mut placed = shipped(64);
            edit(&mut placed[0].bucket);
            refusal(&placed)
        };
        let e = wrong(&|b| b.tensors[1].offset = 20);
        assert!(e.contains("places tensor `b` at byte 20"), "{e}");
        let e = wrong(&|b| b.tensors[2].name = "z".into());
        assert!(e.contains("tensor `z`"), "{e}");
        let e = wrong(&|b| b.tensors[0].dtype = DType::BF16);
        assert!(e.contains("tensor `a`"), "{e}");
        let e = wrong(&|b| b.tensors[3].shape = RVec::from(vec![2, 2]));
        assert!(e.contains("tensor `d`"), "{e}");
        // In its place, but past its bucket's end.
        let e = wrong(&|b| b.bytes = 48);
        assert!(e.contains("tensor `d`"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}
