//! The engine half (engine process): `receive` takes the manifest, receives every frame over
//! [`BRIDGE_GROUP`], checks, decompresses and unshuffles it, and hands the bucket to the
//! engine's sink, which copies it into the weights the engine serves before `put` returns —
//! so the engine never serves this bridge's memory, and the engine checks the digest of its
//! full weights against the trainer's after the last bucket.
//!
//! The buffers (a frame as received, its bucket decompressed) are allocated for the largest
//! frame seen and reused; like the trainer half's frames they are reserved for the version
//! received until this engine's outcome arrives (`after_apply`), and a `receive` before that
//! is refused.
//!
//! After a bad frame (checksum, decompression, the sink refusing it) the remaining frames are
//! still received, not decoded, so the trainer's broadcasts complete and the error that
//! comes back is the bad frame's, not a transport timeout.

use std::time::Instant;

use crate::codec::{self, Unpacker};
use crate::manifest;
use crate::stats::Stats;
use tandem_plugin_api::sdk::{Result, Sink};
use tandem_plugin_api::{
    ApplyOutcome, BRIDGE_GROUP, ErrorCode, HostBox, PluginError, RSliceMut, RStr, Received,
    Shipment, ShipmentBody,
};

/// What the engine half keeps between its calls.
#[derive(Default)]
pub(crate) struct Receiver {
    unpacker: Option<Unpacker>,
    /// A frame as received.
    wire: Vec<u8>,
    /// Its bucket, decompressed and unshuffled.
    raw: Vec<u8>,
    /// The version whose buffers wait for this engine's outcome.
    reserved: Option<u64>,
    /// Figures since the last `stats()`.
    pub stats: Stats,
}

impl Receiver {
    /// Receives the frames of `shipment` and hands their buckets to `sink` (see the module
    /// doc).
    pub(crate) fn receive(
        &mut self,
        host: &HostBox,
        shipment: Shipment,
        sink: &mut Sink,
    ) -> Result<Received> {
        let version = shipment.version;
        let ShipmentBody::Owned { data, wire_bytes } = &shipment.body else {
            return Err(PluginError::invalid_input(format!(
                "squeeze bridge (engine side): got a shipment of {}; it takes the manifest its \
                 trainer half ships",
                shipment.kind_name()
            ))
            .with_help("the trainer must ship through the squeeze bridge too"));
        };
        if let Some(v) = self.reserved {
            return Err(PluginError::invalid_state(format!(
                "squeeze bridge (engine side): asked to receive v{version} while the buffers \
                 of v{v} still wait for that apply's outcome (after_apply)"
            ))
            .with_help("the host reports every apply's outcome before the next receive"));
        }
        let checked = manifest::parse(data, version, *wire_bytes)?;
        let frames = &checked.manifest.frames;
        sink.begin(frames.iter().map(|f| f.bucket()).collect())?;
        if self.unpacker.is_none() {
            self.unpacker = Some(Unpacker::new()?);
        }
        self.reserved = Some(version);
        let group = RStr::from(BRIDGE_GROUP);
        let n = frames.len();
        let mut failed: Option<PluginError> = None;
        for (k, (frame, segments)) in frames.iter().zip(&checked.segments).enumerate() {
            let what = format!("frame {k} of {n} (v{version})");
            let started = Instant::now();
            // Both fit: `parse` checked them against zstd's bound of a `usize`.
            self.wire.resize(frame.wire_bytes as usize, 0);
            host.broadcast(group, 0, RSliceMut::from_mut_slice(&mut self.wire))
                .into_result()
                .map_err(|e| {
                    PluginError::new(
                        e.code,
                        format!("squeeze bridge: receiving {what} failed: {}", e.message),
                    )
                    .with_help(e.help.as_str())
                })?;
            self.stats.received_bytes += frame.wire_bytes;
            if failed.is_some() {
                self.stats.receive += started.elapsed();
                continue;
            }
            if codec::checksum(&self.wire) != frame.xxh3 {
                self.stats.receive += started.elapsed();
                failed = Some(PluginError::new(
                    ErrorCode::Corrupt,
                    format!(
                        "squeeze bridge: {what}: its checksum does not match the trainer's \
                         (damaged in transit); it was not applied"
                    ),
                ));
                continue;
            }
            self.stats.receive += started.elapsed();
            let started = Instant::now();
            let unpacked = match self.unpacker.as_mut() {
                Some(u) => u.unpack(
                    &self.wire,
                    segments,
                    frame.raw_bytes as usize,
                    &mut self.raw,
                    &what,
                ),
                None => Err(PluginError::runtime("squeeze bridge: no decompressor")),
            };
            self.stats.decompress += started.elapsed();
            if let Err(e) = unpacked {
                failed = Some(e);
                continue;
            }
            let started = Instant::now();
            let put = sink.put(&self.raw);
            self.stats.put += started.elapsed();
            if let Err(e) = put {
                failed = Some(
                    PluginError::new(
                        e.code,
                        format!("squeeze bridge: the engine refused {what}: {}", e.message),
                    )
                    .with_help(e.help.as_str()),
                );
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        self.stats.received += 1;
        Ok(Received::Decoded)
    }

    /// This engine's apply of `outcome.version` is over: the buffers may be reused. An
    /// outcome of another version than the reserved one is an error.
    pub(crate) fn after_apply(&mut self, outcome: &ApplyOutcome) -> Result<()> {
        match self.reserved {
            None => Ok(()),
            Some(v) if v == outcome.version => {
                self.reserved = None;
                Ok(())
            }
            Some(v) => Err(PluginError::invalid_state(format!(
                "squeeze bridge (engine side): got the outcome of v{}, but the buffers held are \
                 v{v}'s",
                outcome.version
            ))),
        }
    }
}
