//! Change detection and the bucket plan of a delta: which tensors of the trainer's region
//! differ from what the engines hold, cut into buckets of whole tensors.
//!
//! Each tensor's fingerprint is its byte length and the XXH3-64 hash of its bytes; a tensor
//! ships when it has no fingerprint in the baseline (the first sync: nothing is known of what
//! the engines serve) or a different one. A hash collision would keep a changed tensor back;
//! the engines' check of the full weights' digest catches that, like any wrong delta.
//!
//! Buckets: the changed tensors are grouped into runs — tensors next to each other in the
//! region's layout with no unchanged tensor between them — and each run is cut with
//! [`buckets::plan`] (whole tensors, at most the bucket size, a larger tensor alone). A
//! bucket is then one contiguous byte range of the region, so `transmit` broadcasts it
//! straight from the mapping (no staging copy, no buffer on the trainer side), and an
//! unchanged tensor's bytes never travel. `buckets::plan` on all the changed tensors at once
//! would let a bucket span unchanged tensors lying between changed ones and ship their bytes
//! too; packing the changed tensors into a staging buffer would cost a copy of every shipped
//! byte and a bucket-sized buffer. The price of runs is one more bucket (two broadcasts and a
//! 32-byte trailer) per unchanged gap, small beside the bytes a gap saves.

use std::collections::HashMap;

use tandem_plugin_api::sdk::buckets;
use tandem_plugin_api::{PluginError, TensorBucket, TensorSpec};

/// A tensor's fingerprint: its length in bytes and the XXH3-64 hash of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    bytes: u64,
    hash: u64,
}

impl Fingerprint {
    /// The fingerprint of a tensor's bytes.
    pub(crate) fn of(data: &[u8]) -> Fingerprint {
        Fingerprint {
            bytes: data.len() as u64,
            hash: xxhash_rust::xxh3::xxh3_64(data),
        }
    }
}

/// Fingerprints by tensor name.
pub(crate) type Fingerprints = HashMap<String, Fingerprint>;

/// What one sync ships.
#[derive(Debug)]
pub(crate) struct Delta {
    /// The buckets, in send order (offsets relative to each bucket's start).
    pub buckets: Vec<TensorBucket>,
    /// Each bucket's start in the region.
    pub starts: Vec<u64>,
    /// Every tensor's fingerprint now: the baseline of the next sync once every engine applied
    /// this one.
    pub fingerprints: Fingerprints,
    /// Tensors shipped, and in the layout.
    pub shipped_tensors: usize,
    /// The tensors in the layout.
    pub total_tensors: usize,
    /// Bytes the buckets carry (the shipped tensors, and padding between them), and the
    /// bytes of every tensor in the layout.
    pub shipped_bytes: u64,
    /// Bytes of every tensor in the layout.
    pub total_bytes: u64,
}

/// The delta of `region` (laid out as `layout`) against `baseline`, in buckets of at most
/// `bucket_bytes`. Fails, naming the tensor, when a tensor lies outside the region.
pub(crate) fn delta(
    layout: &[TensorSpec],
    region: &[u8],
    baseline: &Fingerprints,
    bucket_bytes: u64,
) -> Result<Delta, PluginError> {
    let mut order: Vec<&TensorSpec> = layout.iter().collect();
    order.sort_by_key(|t| t.offset);
    let mut out = Delta {
        buckets: Vec::new(),
        starts: Vec::new(),
        fingerprints: Fingerprints::with_capacity(layout.len()),
        shipped_tensors: 0,
        total_tensors: layout.len(),
        shipped_bytes: 0,
        total_bytes: 0,
    };
    let mut run: Vec<TensorSpec> = Vec::new();
    for t in order {
        let len = buckets::tensor_bytes(t);
        let end = t.offset.checked_add(len);
        let Some(data) = end
            .filter(|&end| end <= region.len() as u64)
            .map(|end| &region[t.offset as usize..end as usize])
        else {
            return Err(PluginError::invalid_input(format!(
                "delta bridge: tensor `{}` ({len} bytes at byte {}) lies outside the trainer's \
                 region ({} bytes)",
                t.name,
                t.offset,
                region.len()
            ))
            .with_help("the trainer's export must describe the region it exports"));
        };
        let now = Fingerprint::of(data);
        out.total_bytes += len;
        if baseline.get(t.name.as_str()) == Some(&now) {
            close(&mut out, &mut run, bucket_bytes);
        } else {
            out.shipped_tensors += 1;
            run.push(t.clone());
        }
        out.fingerprints.insert(t.name.to_string(), now);
    }
    close(&mut out, &mut run, bucket_bytes);
    Ok(out)
}

/// Cuts the run of changed tensors `run` into buckets appended to `out`, and empties it.
fn close(out: &mut Delta, run: &mut Vec<TensorSpec>, bucket_bytes: u64) {
    if run.is_empty() {
        return;
    }
    let (planned, starts) = buckets::plan(run, bucket_bytes);
    out.shipped_bytes += planned.iter().map(|b| b.bytes).sum::<u64>();
    out.buckets.extend(planned);
    out.starts.extend(starts);
    run.clear();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tandem_plugin_api::{DType, RVec};

    /// Tensors a..e of 4 f32 each (16 bytes), back to back from byte 0.
    fn layout() -> Vec<TensorSpec> {
        ["a", "b", "c", "d", "e"]
            .iter()
            .enumerate()
            .map(|(i, n)| TensorSpec {
                name: (*n).into(),
                dtype: DType::F32,
                shape: RVec::from(vec![4u64]),
                offset: 16 * i as u64,
            })
            .collect()
    }

    fn region() -> Vec<u8> {
        (0..80u8).collect()
    }

    /// Each bucket's tensor names.
    fn names(d: &Delta) -> Vec<Vec<String>> {
        d.buckets
            .iter()
            .map(|b| b.tensors.iter().map(|t| t.name.to_string()).collect())
            .collect()
    }

    fn touch(region: &mut [u8], tensor: usize) {
        region[16 * tensor + 3] ^= 0x80;
    }

    #[test]
    fn the_first_sync_ships_every_tensor() {
        let d = delta(&layout(), &region(), &Fingerprints::new(), 1 << 20).unwrap();
        assert_eq!(names(&d), [["a", "b", "c", "d", "e"]]);
        assert_eq!(d.starts, [0]);
        assert_eq!((d.shipped_tensors, d.total_tensors), (5, 5));
        assert_eq!((d.shipped_bytes, d.total_bytes), (80, 80));
        assert_eq!(d.fingerprints.len(), 5);
    }

    #[test]
    fn unchanged_weights_ship_nothing() {
        let r = region();
        let first = delta(&layout(), &r, &Fingerprints::new(), 1 << 20).unwrap();
        let d = delta(&layout(), &r, &first.fingerprints, 1 << 20).unwrap();
        assert!(d.buckets.is_empty() && d.starts.is_empty());
        assert_eq!((d.shipped_tensors, d.shipped_bytes), (0, 0));
        assert_eq!(d.fingerprints, first.fingerprints);
    }

    #[test]
    fn only_changed_tensors_ship_and_a_bucket_never_spans_an_unchanged_one() {
        let mut r = region();
        let base = delta(&layout(), &r, &Fingerprints::new(), 1 << 20)
            .unwrap()
            .fingerprints;
        touch(&mut r, 1);
        touch(&mut r, 3);
        let d = delta(&layout(), &r, &base, 1 << 20).unwrap();
        assert_eq!(names(&d), [["b"], ["d"]]);
        assert_eq!(d.starts, [16, 48]);
        assert!(d.buckets.iter().all(|b| b.bytes == 16));
        assert!(d.buckets.iter().all(|b| b.tensors[0].offset == 0));
        assert_eq!((d.shipped_tensors, d.shipped_bytes), (2, 32));
        // Each bucket's bytes are the changed tensor's bytes in the region.
        for (b, s) in d.buckets.iter().zip(&d.starts) {
            let t = layout().into_iter().find(|t| t.name == b.tensors[0].name);
            assert_eq!(t.unwrap().offset, *s);
        }
    }

    #[test]
    fn adjacent_changed_tensors_share_a_bucket_up_to_the_bucket_size() {
        let mut r = region();
        let base = delta(&layout(), &r, &Fingerprints::new(), 1 << 20)
            .unwrap()
            .fingerprints;
        for t in [1, 2, 3] {
            touch(&mut r, t);
        }
        let d = delta(&layout(), &r, &base, 1 << 20).unwrap();
        assert_eq!(names(&d), [["b", "c", "d"]]);
        assert_eq!((d.starts[0], d.buckets[0].bytes), (16, 48));
        let offsets: Vec<u64> = d.buckets[0].tensors.iter().map(|t| t.offset).collect();
        assert_eq!(offsets, [0, 16, 32], "offsets relative to the bucket");
        // 40-byte buckets: two tensors fit, the third starts the next bucket.
        let small = delta(&layout(), &r, &base, 40).unwrap();
        assert_eq!(names(&small), [vec!["b", "c"], vec!["d"]]);
        assert_eq!(small.starts, [16, 48]);
        assert_eq!(small.shipped_bytes, 48);
    }

    #[test]
    fn the_layout_order_is_the_regions_not_the_lists() {
        let mut shuffled = layout();
        shuffled.reverse();
        let d = delta(&shuffled, &region(), &Fingerprints::new(), 1 << 20).unwrap();
        assert_eq!(names(&d), [["a", "b", "c", "d", "e"]]);
    }

    #[test]
    fn a_tensor_without_a_baseline_or_of_another_length_ships() {
        let r = region();
        let mut base = delta(&layout(), &r, &Fingerprints::new(), 1 << 20)
            .unwrap()
            .fingerprints;
        base.remove("c");
        // Same hash, another length: not the same tensor.
        let e = base["e"];
        base.insert(
            "e".into(),
            Fingerprint {
                bytes: e.bytes + 4,
                hash: e.hash,
            },
        );
        let d = delta(&layout(), &r, &base, 1 << 20).unwrap();
        assert_eq!(names(&d), [["c"], ["e"]]);
    }

    #[test]
    fn a_tensor_outside_the_region_is_named() {
        let e = delta(&layout(), &region()[..70], &Fingerprints::new(), 1 << 20).unwrap_err();
        assert!(e.message.contains("tensor `e`"), "{e}");
        assert!(
            e.message
                .contains("outside the trainer's region (70 bytes)"),
            "{e}"
        );
    }
}
