//! The bridge's own payload: the manifest its trainer half ships (as JSON, in a
//! `ShipmentBody::Owned`) and its engine halves parse before anything travels. Per frame, in
//! send order: the bucket's tensors (name, dtype, shape, offset in the bucket), its raw and
//! compressed sizes and the XXH3-64 checksum of the compressed bytes.
//!
//! [`parse`] checks everything a receiver sizes buffers or indexes by — format tag, version,
//! every tensor inside its frame, every frame no larger than zstd can make of its raw bytes,
//! the frames' sum equal to the shipment's wire bytes — so bad bytes are one error line,
//! never a panic or a runaway allocation.

use crate::codec;
use crate::shuffle::{self, Segment};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::serde::{Deserialize, Serialize};
use tandem_plugin_api::{PluginError, TensorBucket, TensorSpec};

/// The format tag; a manifest with another is refused.
pub(crate) const FORMAT: &str = "tandem-squeeze/1";

/// What the engines need to receive and decode one sync.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "tandem_plugin_api::serde", deny_unknown_fields)]
pub(crate) struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// The weight version the frames carry.
    pub version: u64,
    /// The zstd level they were compressed at (for logs; decompression does not need it).
    pub level: i32,
    /// The frames, in send order.
    pub frames: Vec<Frame>,
}

/// One frame: a compressed bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "tandem_plugin_api::serde", deny_unknown_fields)]
pub(crate) struct Frame {
    /// The bucket's first byte in the trainer's weights region.
    pub start: u64,
    /// The bucket's tensors, offsets relative to the bucket.
    pub tensors: Vec<TensorSpec>,
    /// The bucket's bytes (decompressed).
    pub raw_bytes: u64,
    /// The frame's bytes on the wire (compressed).
    pub wire_bytes: u64,
    /// XXH3-64 of the compressed bytes.
    pub xxh3: u64,
}

impl Frame {
    /// The bucket as the engine's sink takes it.
    pub(crate) fn bucket(&self) -> TensorBucket {
        TensorBucket {
            tensors: self.tensors.clone().into(),
            bytes: self.raw_bytes,
        }
    }
}

impl Manifest {
    /// The manifest as shipped.
    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self)
            .map_err(|e| PluginError::runtime(format!("squeeze bridge: writing the manifest: {e}")))
    }

    /// Bytes on the wire: the frames' sum.
    pub(crate) fn wire_bytes(&self) -> u64 {
        self.frames.iter().map(|f| f.wire_bytes).sum()
    }

    /// Bytes decompressed: the buckets' sum.
    pub(crate) fn raw_bytes(&self) -> u64 {
        self.frames.iter().map(|f| f.raw_bytes).sum()
    }
}

/// A manifest that passed [`parse`], with each frame's shuffle segments.
#[derive(Debug)]
pub(crate) struct Checked {
    /// The manifest.
    pub manifest: Manifest,
    /// Each frame's segments (they cover exactly its raw bytes).
    pub segments: Vec<Vec<Segment>>,
}

/// The help every refusal carries.
const HELP: &str = "the trainer and every engine must load the same squeeze bridge \
                    (plugin example-squeeze); the shipment must be what its trainer half shipped";

fn bad(version: u64, what: String) -> PluginError {
    PluginError::invalid_input(format!(
        "squeeze bridge (engine side): the shipment of v{version} {what}"
    ))
    .with_help(HELP)
}

/// Parses and checks `data`, the payload of a shipment of `version` whose body says it puts
/// `wire_bytes` on the wire.
pub(crate) fn parse(data: &[u8], version: u64, wire_bytes: u64) -> Result<Checked> {
    let manifest: Manifest = serde_json::from_slice(data).map_err(|e| {
        bad(
            version,
            format!("is not a squeeze manifest ({} bytes): {e}", data.len()),
        )
    })?;
    if manifest.format != FORMAT {
        return Err(bad(
            version,
            format!(
                "has manifest format `{}`; this bridge reads `{FORMAT}`",
                manifest.format
            ),
        ));
    }
    if manifest.version != version {
        return Err(bad(
            version,
            format!("carries a manifest of v{}", manifest.version),
        ));
    }
    if manifest.frames.is_empty() {
        return Err(bad(version, "lists no frames".into()));
    }
    let mut segments = Vec::with_capacity(manifest.frames.len());
    for (k, f) in manifest.frames.iter().enumerate() {
        let raw = usize::try_from(f.raw_bytes).map_err(|_| {
            bad(
                version,
                format!(
                    "has frame {k} of {} raw bytes, more than fit here",
                    f.raw_bytes
                ),
            )
        })?;
        if f.wire_bytes == 0 || f.wire_bytes > codec::bound(raw) as u64 {
            return Err(bad(
                version,
                format!(
                    "has frame {k} of {} wire bytes; zstd makes 1 to {} of its {raw} raw bytes",
                    f.wire_bytes,
                    codec::bound(raw)
                ),
            ));
        }
        let bucket = f.bucket();
        let Some(segs) = shuffle::segments(&bucket) else {
            let past = f
                .tensors
                .iter()
                .find(|t| {
                    shuffle::tensor_bytes(t)
                        .and_then(|n| n.checked_add(t.offset))
                        .is_none_or(|end| end > f.raw_bytes)
                })
                .map_or("?".to_owned(), |t| t.name.to_string());
            return Err(bad(
                version,
                format!(
                    "has frame {k} whose tensor `{past}` ends past the frame's {raw} raw bytes"
                ),
            ));
        };
        segments.push(segs);
    }
    let sum = manifest
        .frames
        .iter()
        .try_fold(0u64, |acc, f| acc.checked_add(f.wire_bytes));
    if sum != Some(wire_bytes) {
        return Err(bad(
            version,
            format!(
                "says {wire_bytes} wire bytes, its frames add up to {}",
                sum.map_or("more than 2^64".to_owned(), |s| s.to_string())
            ),
        ));
    }
    Ok(Checked { manifest, segments })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tandem_plugin_api::{DType, ErrorCode, RVec};

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: 3,
            level: 1,
            frames: vec![
                Frame {
                    start: 0,
                    tensors: vec![TensorSpec {
                        name: "model.embed_tokens.weight".into(),
                        dtype: DType::F32,
                        shape: RVec::from(vec![4, 8]),
                        offset: 0,
                    }],
                    raw_bytes: 128,
                    wire_bytes: 100,
                    xxh3: 7,
                },
                Frame {
                    start: 128,
                    tensors: vec![TensorSpec {
                        name: "model.norm.weight".into(),
                        dtype: DType::BF16,
                        shape: RVec::from(vec![8]),
                        offset: 0,
                    }],
                    raw_bytes: 16,
                    wire_bytes: 20,
                    xxh3: 9,
                },
            ],
        }
    }

    fn refusal(data: &[u8], version: u64, wire: u64) -> String {
        let e = parse(data, version, wire).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
        assert!(e.help.contains("same squeeze bridge"), "{e}");
        assert!(!e.message.contains('\n'), "one line: {e}");
        e.message.to_string()
    }

    #[test]
    fn a_manifest_roundtrips_with_its_segments() {
        let m = manifest();
        let checked = parse(&m.to_bytes().unwrap(), 3, 120).unwrap();
        assert_eq!(checked.manifest, m);
        assert_eq!(checked.segments.len(), 2);
        assert_eq!(checked.segments[1][0].elem, 2);
        assert_eq!((m.raw_bytes(), m.wire_bytes()), (144, 120));
    }

    #[test]
    fn bytes_that_are_not_a_manifest_are_one_line() {
        let m = refusal(b"\x28\xb5\x2f\xfd garbage", 3, 120);
        assert!(m.contains("v3 is not a squeeze manifest (12 bytes)"), "{m}");
        let m = refusal(br#"{"format": "tandem-squeeze/1"}"#, 3, 120);
        assert!(m.contains("missing field"), "{m}");
    }

    #[test]
    fn another_format_or_version_is_refused() {
        let mut m = manifest();
        m.format = "tandem-squeeze/9".into();
        let msg = refusal(&m.to_bytes().unwrap(), 3, 120);
        assert!(msg.contains("format `tandem-squeeze/9`"), "{msg}");
        let msg = refusal(&manifest().to_bytes().unwrap(), 4, 120);
        assert!(msg.contains("v4 carries a manifest of v3"), "{msg}");
    }

    #[test]
    fn sizes_a_receiver_would_trust_are_checked() {
        let mut m = manifest();
        m.frames[0].tensors[0].offset = 8;
        let msg = refusal(&m.to_bytes().unwrap(), 3, 120);
        assert!(
            msg.contains("frame 0 whose tensor `model.embed_tokens.weight` ends past"),
            "{msg}"
        );
        let mut m = manifest();
        m.frames[1].wire_bytes = 1 << 40;
        let msg = refusal(&m.to_bytes().unwrap(), 3, 100 + (1 << 40));
        assert!(msg.contains("frame 1 of 1099511627776 wire bytes"), "{msg}");
        let msg = refusal(&manifest().to_bytes().unwrap(), 3, 121);
        assert!(
            msg.contains("says 121 wire bytes, its frames add up to 120"),
            "{msg}"
        );
        let mut m = manifest();
        m.frames.clear();
        assert!(refusal(&m.to_bytes().unwrap(), 3, 0).contains("lists no frames"));
    }
}
