//! One bucket to a frame and back: [`Packer`] shuffles a bucket's bytes
//! ([`shuffle`](crate::shuffle)) and compresses them with zstd; [`Unpacker`] decompresses a
//! frame and unshuffles it. Each keeps its zstd context and its scratch buffer across calls
//! (allocated for the largest bucket seen, then reused), and writes into a buffer its caller
//! keeps. A frame is checked by an XXH3-64 checksum ([`checksum`]) before it is decompressed.

use crate::shuffle::{self, Segment};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError};

/// The checksum a frame travels with: XXH3-64 of its compressed bytes.
pub(crate) fn checksum(frame: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(frame)
}

/// The largest frame zstd can make of `raw` bytes.
pub(crate) fn bound(raw: usize) -> usize {
    zstd::compress_bound(raw)
}

/// Shuffles and compresses buckets (trainer side).
pub(crate) struct Packer {
    compressor: zstd::bulk::Compressor<'static>,
    scratch: Vec<u8>,
}

impl Packer {
    /// A packer at zstd level `level`.
    pub(crate) fn new(level: i32) -> Result<Packer> {
        let compressor = zstd::bulk::Compressor::new(level).map_err(|e| {
            PluginError::runtime(format!(
                "squeeze bridge: creating a zstd compressor at level {level}: {e}"
            ))
        })?;
        Ok(Packer {
            compressor,
            scratch: Vec::new(),
        })
    }

    /// Compresses bucket `raw` (cut into `segments`) into `frame`, replacing its contents
    /// (its allocation is kept and grown to zstd's bound when needed).
    pub(crate) fn pack(
        &mut self,
        raw: &[u8],
        segments: &[Segment],
        frame: &mut Vec<u8>,
    ) -> Result<()> {
        covers(segments, raw.len())?;
        self.scratch.resize(raw.len(), 0);
        shuffle::shuffle(raw, &mut self.scratch, segments);
        frame.clear();
        frame.reserve(bound(raw.len()));
        self.compressor
            .compress_to_buffer(&self.scratch, frame)
            .map_err(|e| {
                PluginError::runtime(format!(
                    "squeeze bridge: compressing a bucket of {} bytes: {e}",
                    raw.len()
                ))
            })?;
        Ok(())
    }
}

/// Decompresses and unshuffles frames (engine side).
pub(crate) struct Unpacker {
    decompressor: zstd::bulk::Decompressor<'static>,
    scratch: Vec<u8>,
}

impl Unpacker {
    /// An unpacker.
    pub(crate) fn new() -> Result<Unpacker> {
        let decompressor = zstd::bulk::Decompressor::new().map_err(|e| {
            PluginError::runtime(format!("squeeze bridge: creating a zstd decompressor: {e}"))
        })?;
        Ok(Unpacker {
            decompressor,
            scratch: Vec::new(),
        })
    }

    /// Decompresses `frame` (which must hold exactly `raw_len` bytes once decompressed) and
    /// unshuffles it into `raw` (resized to `raw_len`; its allocation is reused). `what`
    /// names the frame in errors.
    pub(crate) fn unpack(
        &mut self,
        frame: &[u8],
        segments: &[Segment],
        raw_len: usize,
        raw: &mut Vec<u8>,
        what: &str,
    ) -> Result<()> {
        covers(segments, raw_len)?;
        self.scratch.clear();
        self.scratch.reserve(raw_len);
        let n = self
            .decompressor
            .decompress_to_buffer(frame, &mut self.scratch)
            .map_err(|e| {
                PluginError::new(
                    ErrorCode::Corrupt,
                    format!("squeeze bridge: {what} does not decompress: {e}"),
                )
            })?;
        if n != raw_len {
            return Err(PluginError::new(
                ErrorCode::Corrupt,
                format!(
                    "squeeze bridge: {what} decompresses to {n} bytes, its manifest says \
                     {raw_len}"
                ),
            ));
        }
        raw.resize(raw_len, 0);
        shuffle::unshuffle(&self.scratch, raw, segments);
        Ok(())
    }
}

/// Checks that `segments` cover exactly `len` bytes, in order (what `shuffle` indexes by).
fn covers(segments: &[Segment], len: usize) -> Result<()> {
    let mut at = 0usize;
    for s in segments {
        if s.start != at {
            return Err(not_covered(len));
        }
        at = s.start.saturating_add(s.len);
    }
    if at == len {
        Ok(())
    } else {
        Err(not_covered(len))
    }
}

fn not_covered(len: usize) -> PluginError {
    PluginError::runtime(format!(
        "squeeze bridge: a bucket's segments do not cover its {len} bytes"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::shuffle::segments;
    use tandem_plugin_api::{DType, RVec, TensorBucket, TensorSpec};

    /// A bucket of two f32 tensors of smooth "weights" (small values: their exponent bytes
    /// repeat) and the bucket's bytes.
    fn weights() -> (TensorBucket, Vec<u8>) {
        let n = 4096u64;
        let tensors = vec![
            TensorSpec {
                name: "a".into(),
                dtype: DType::F32,
                shape: RVec::from(vec![n]),
                offset: 0,
            },
            TensorSpec {
                name: "b".into(),
                dtype: DType::F32,
                shape: RVec::from(vec![64, n / 64]),
                offset: 4 * n,
            },
        ];
        let mut x = 12345u32;
        let raw: Vec<u8> = (0..2 * n)
            .flat_map(|_| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                let v = ((x >> 8) as f32 / 16777216.0 - 0.5) * 0.04;
                v.to_le_bytes()
            })
            .collect();
        let bucket = TensorBucket {
            tensors: RVec::from(tensors),
            bytes: raw.len() as u64,
        };
        (bucket, raw)
    }

    #[test]
    fn a_bucket_compresses_and_comes_back_bit_for_bit() {
        let (bucket, raw) = weights();
        let segs = segments(&bucket).unwrap();
        let mut packer = Packer::new(1).unwrap();
        let mut unpacker = Unpacker::new().unwrap();
        let (mut frame, mut back) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            // Twice: reused buffers give the same result.
            packer.pack(&raw, &segs, &mut frame).unwrap();
            // Random small floats: their sign-and-exponent bytes compress, the rest barely.
            assert!(
                frame.len() < raw.len() * 95 / 100,
                "compressed: {} of {} bytes",
                frame.len(),
                raw.len()
            );
            unpacker
                .unpack(&frame, &segs, raw.len(), &mut back, "frame 0")
                .unwrap();
            assert_eq!(back, raw);
        }
    }

    #[test]
    fn a_damaged_or_mis_sized_frame_is_refused_as_corrupt() {
        let (bucket, raw) = weights();
        let segs = segments(&bucket).unwrap();
        let mut frame = Vec::new();
        Packer::new(3)
            .unwrap()
            .pack(&raw, &segs, &mut frame)
            .unwrap();
        let mut unpacker = Unpacker::new().unwrap();
        let mut back = Vec::new();
        let e = unpacker
            .unpack(
                &frame[..frame.len() / 2],
                &segs,
                raw.len(),
                &mut back,
                "frame 3",
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Corrupt);
        assert!(e.message.contains("frame 3 does not decompress"), "{e}");
        // A manifest that claims fewer bytes than the frame holds.
        let short = segments(&TensorBucket {
            tensors: RVec::new(),
            bytes: 100,
        })
        .unwrap();
        let e = unpacker
            .unpack(&frame, &short, 100, &mut back, "frame 1")
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Corrupt, "{e}");
    }

    #[test]
    fn segments_that_do_not_cover_the_bucket_are_an_error_not_a_panic() {
        let segs = [Segment {
            start: 0,
            len: 8,
            elem: 4,
        }];
        let mut frame = Vec::new();
        let e = Packer::new(1)
            .unwrap()
            .pack(&[0u8; 12], &segs, &mut frame)
            .unwrap_err();
        assert!(e.message.contains("do not cover its 12 bytes"), "{e}");
    }
}
