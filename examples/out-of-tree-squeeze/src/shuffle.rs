//! The byte shuffle: within each tensor of a bucket, byte `j` of every element is grouped
//! (all first bytes, then all second bytes, …), so the slowly varying bytes of floats (sign
//! and exponent) sit together and compress, while the noisy low mantissa bytes sit apart.
//!
//! A bucket is cut into [`Segment`]s that cover its bytes exactly, in order: each tensor with
//! its dtype's element size, the bytes between tensors (and after the last) with size 1 (a
//! plain copy). Sender and receiver cut a bucket from the same tensor list, so
//! [`unshuffle`] undoes [`shuffle`] exactly: the transform is lossless. Pure functions, no
//! I/O.

use tandem_plugin_api::TensorBucket;

/// A run of a bucket's bytes shuffled with one element size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// First byte, relative to the bucket.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// Element size (1: copied as is).
    pub elem: usize,
}

/// Bytes of a tensor (element count times element size), if that fits in a `u64`.
pub(crate) fn tensor_bytes(t: &tandem_plugin_api::TensorSpec) -> Option<u64> {
    t.shape
        .iter()
        .try_fold(t.dtype.size() as u64, |acc, &d| acc.checked_mul(d))
}

/// The segments of a bucket of `bytes` bytes holding `bucket`'s tensors; `None` when a tensor
/// ends past the bucket's end. Tensors are taken in offset order; bytes a tensor shares with
/// the one before it (overlapping layouts) are copied as is.
pub(crate) fn segments(bucket: &TensorBucket) -> Option<Vec<Segment>> {
    let total = usize::try_from(bucket.bytes).ok()?;
    let mut tensors: Vec<(u64, u64, usize)> = Vec::with_capacity(bucket.tensors.len());
    for t in bucket.tensors.iter() {
        let len = tensor_bytes(t)?;
        let end = t.offset.checked_add(len)?;
        if end > bucket.bytes {
            return None;
        }
        tensors.push((t.offset, end, t.dtype.size()));
    }
    tensors.sort_unstable();
    let mut out = Vec::with_capacity(2 * tensors.len() + 1);
    let mut cursor = 0usize;
    let push = |start: usize, end: usize, elem: usize, out: &mut Vec<Segment>| {
        if end > start {
            out.push(Segment {
                start,
                len: end - start,
                elem,
            });
        }
    };
    for (start, end, elem) in tensors {
        // Both fit in `usize`: they are at most `total`.
        let (start, end) = (start as usize, end as usize);
        if start >= cursor {
            push(cursor, start, 1, &mut out);
            push(start, end, elem, &mut out);
        } else {
            push(cursor, end, 1, &mut out);
        }
        cursor = cursor.max(end);
    }
    push(cursor, total, 1, &mut out);
    Some(out)
}

/// Shuffles `src` into `dst` (the same length), segment by segment.
pub(crate) fn shuffle(src: &[u8], dst: &mut [u8], segments: &[Segment]) {
    for s in segments {
        let range = s.start..s.start + s.len;
        shuffle_run(&src[range.clone()], &mut dst[range], s.elem);
    }
}

/// Undoes [`shuffle`] with the same segments: `src` shuffled, `dst` the original bytes.
pub(crate) fn unshuffle(src: &[u8], dst: &mut [u8], segments: &[Segment]) {
    for s in segments {
        let range = s.start..s.start + s.len;
        unshuffle_run(&src[range.clone()], &mut dst[range], s.elem);
    }
}

/// One run: `src` as elements of `elem` bytes, byte planes written one after another into
/// `dst`; a tail shorter than an element is copied last, as is.
fn shuffle_run(src: &[u8], dst: &mut [u8], elem: usize) {
    let n = src.len() / elem.max(1);
    let (body, tail) = src.split_at(n * elem);
    let (planes, dst_tail) = dst.split_at_mut(n * elem);
    dst_tail.copy_from_slice(tail);
    if elem <= 1 || n == 0 {
        planes.copy_from_slice(body);
        return;
    }
    match elem {
        2 => {
            let (p0, p1) = planes.split_at_mut(n);
            for ((e, a), b) in body.chunks_exact(2).zip(p0).zip(p1) {
                *a = e[0];
                *b = e[1];
            }
        }
        4 => {
            let (p0, rest) = planes.split_at_mut(n);
            let (p1, rest) = rest.split_at_mut(n);
            let (p2, p3) = rest.split_at_mut(n);
            for ((((e, a), b), c), d) in body.chunks_exact(4).zip(p0).zip(p1).zip(p2).zip(p3) {
                *a = e[0];
                *b = e[1];
                *c = e[2];
                *d = e[3];
            }
        }
        _ => {
            for (j, plane) in planes.chunks_exact_mut(n).enumerate() {
                for (out, e) in plane.iter_mut().zip(body.chunks_exact(elem)) {
                    *out = e[j];
                }
            }
        }
    }
}

/// The inverse of [`shuffle_run`].
fn unshuffle_run(src: &[u8], dst: &mut [u8], elem: usize) {
    let n = src.len() / elem.max(1);
    let (planes, tail) = src.split_at(n * elem);
    let (body, dst_tail) = dst.split_at_mut(n * elem);
    dst_tail.copy_from_slice(tail);
    if elem <= 1 || n == 0 {
        body.copy_from_slice(planes);
        return;
    }
    match elem {
        2 => {
            let (p0, p1) = planes.split_at(n);
            for ((e, a), b) in body.chunks_exact_mut(2).zip(p0).zip(p1) {
                e[0] = *a;
                e[1] = *b;
            }
        }
        4 => {
            let (p0, rest) = planes.split_at(n);
            let (p1, rest) = rest.split_at(n);
            let (p2, p3) = rest.split_at(n);
            for ((((e, a), b), c), d) in body.chunks_exact_mut(4).zip(p0).zip(p1).zip(p2).zip(p3) {
                e[0] = *a;
                e[1] = *b;
                e[2] = *c;
                e[3] = *d;
            }
        }
        _ => {
            for (j, plane) in planes.chunks_exact(n).enumerate() {
                for (b, e) in plane.iter().zip(body.chunks_exact_mut(elem)) {
                    e[j] = *b;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tandem_plugin_api::{DType, RVec, TensorSpec};

    fn spec(name: &str, dtype: DType, n: u64, offset: u64) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: RVec::from(vec![n]),
            offset,
        }
    }

    fn bucket(tensors: Vec<TensorSpec>, bytes: u64) -> TensorBucket {
        TensorBucket {
            tensors: RVec::from(tensors),
            bytes,
        }
    }

    fn noise(len: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn f32_elements_become_four_byte_planes() {
        let src: Vec<u8> = (0..12).collect(); // three 4-byte elements
        let segs = segments(&bucket(vec![spec("w", DType::F32, 3, 0)], 12)).unwrap();
        let mut dst = vec![0; 12];
        shuffle(&src, &mut dst, &segs);
        assert_eq!(dst, [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]);
    }

    #[test]
    fn segments_cover_the_bucket_with_gaps_copied() {
        // A bf16 tensor at 4, an f32 one at 16, an i64 one at 28; gaps at 0..4, 10..16 and
        // the tail 44..50.
        let b = bucket(
            vec![
                spec("c", DType::I64, 2, 28),
                spec("a", DType::BF16, 3, 4),
                spec("b", DType::F32, 3, 16),
            ],
            50,
        );
        let segs = segments(&b).unwrap();
        let runs: Vec<(usize, usize, usize)> =
            segs.iter().map(|s| (s.start, s.len, s.elem)).collect();
        assert_eq!(
            runs,
            [
                (0, 4, 1),
                (4, 6, 2),
                (10, 6, 1),
                (16, 12, 4),
                (28, 16, 8),
                (44, 6, 1)
            ]
        );
    }

    #[test]
    fn unshuffle_undoes_shuffle_for_every_element_size_and_odd_lengths() {
        let layouts = [
            vec![
                spec("a", DType::F32, 1001, 0),
                spec("b", DType::BF16, 77, 4004),
            ],
            vec![spec("a", DType::I64, 33, 3), spec("b", DType::U8, 5, 300)],
            vec![spec("a", DType::F16, 0, 0), spec("b", DType::I32, 1, 9)],
            vec![],
        ];
        for (k, tensors) in layouts.into_iter().enumerate() {
            let end = tensors
                .iter()
                .map(|t| t.offset + tensor_bytes(t).unwrap())
                .max()
                .unwrap_or(0);
            let b = bucket(tensors, end + 7);
            let segs = segments(&b).unwrap();
            let src = noise(b.bytes as usize, k as u32);
            let mut shuffled = vec![0; src.len()];
            let mut back = vec![0; src.len()];
            shuffle(&src, &mut shuffled, &segs);
            unshuffle(&shuffled, &mut back, &segs);
            assert_eq!(back, src, "layout {k}");
        }
    }

    #[test]
    fn overlapping_tensors_still_roundtrip() {
        let b = bucket(
            vec![spec("a", DType::F32, 4, 0), spec("b", DType::F32, 4, 8)],
            24,
        );
        let segs = segments(&b).unwrap();
        assert_eq!(segs.iter().map(|s| s.len).sum::<usize>(), 24);
        let src = noise(24, 9);
        let (mut s, mut back) = (vec![0; 24], vec![0; 24]);
        shuffle(&src, &mut s, &segs);
        unshuffle(&s, &mut back, &segs);
        assert_eq!(back, src);
    }

    #[test]
    fn a_tensor_past_the_bucket_end_or_of_overflowing_size_has_no_segments() {
        assert!(segments(&bucket(vec![spec("a", DType::F32, 4, 4)], 16)).is_none());
        let mut huge = spec("a", DType::F32, u64::MAX / 2, 0);
        huge.shape = RVec::from(vec![u64::MAX / 2, 4]);
        assert!(segments(&bucket(vec![huge], 16)).is_none());
    }
}
