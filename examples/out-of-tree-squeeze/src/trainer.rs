//! The trainer half (trainer process): `ship` compresses the trainer's weights into frames
//! the bridge keeps, `transmit` broadcasts them, `after_apply` releases them.
//!
//! `ship` takes the trainer's `SharedRegion` export (key + tensor layout; later exports of
//! the same region carry no layout, so the one seen first is kept), maps the region
//! ([`Region`], kept across syncs), cuts the layout into buckets ([`buckets::plan`], once per
//! layout) and compresses every bucket into its frame ([`Packer`], on up to `threads`
//! threads), then returns the manifest ([`crate::manifest`]) as a bridge-owned payload with
//! the export's version and digest. The frames' buffers are reused from sync to sync, so
//! they are *reserved* for the shipped version until the sync's outcome arrives
//! (`after_apply`): a `ship` before that is refused instead of overwriting frames the
//! engines may still be receiving.

use std::sync::Mutex;
use std::time::Instant;

use crate::codec::{self, Packer};
use crate::manifest::{self, Manifest};
use crate::options::Options;
use crate::shuffle::{self, Segment};
use crate::stats::Stats;
use tandem_plugin_api::sdk::region::Region;
use tandem_plugin_api::sdk::{Result, buckets};
use tandem_plugin_api::{
    ApplyOutcome, BRIDGE_GROUP, HostBox, LogLevel, PluginError, RSliceMut, RStr, Shipment,
    ShipmentBody, TensorBucket, TensorSpec, UpdatePayload, WeightUpdate,
};

/// The buckets of one layout.
struct Plan {
    buckets: Vec<TensorBucket>,
    starts: Vec<u64>,
    segments: Vec<Vec<Segment>>,
}

/// A compressed bucket, as the bridge keeps it between `ship` and `transmit`.
#[derive(Default)]
struct Packed {
    data: Vec<u8>,
    checksum: u64,
}

/// What the trainer half keeps between its calls.
#[derive(Default)]
pub(crate) struct Sender {
    /// The region's key and layout, as the trainer's first export of it carried.
    layout: Option<(String, Vec<TensorSpec>)>,
    /// Its buckets (made with the layout).
    plan: Option<Plan>,
    /// The region mapped in this process.
    region: Option<Region>,
    packers: Vec<Packer>,
    frames: Vec<Packed>,
    /// The manifest last shipped.
    manifest: Vec<u8>,
    /// The version whose frames wait for its sync's outcome.
    reserved: Option<u64>,
    /// Figures since the last `stats()`.
    pub stats: Stats,
}

fn log(host: &HostBox, message: &str) {
    host.log(LogLevel::Info, "squeeze".into(), RStr::from(message));
}

impl Sender {
    /// Turns the trainer's export into the shipment (see the module doc).
    pub(crate) fn ship(
        &mut self,
        host: &HostBox,
        options: &Options,
        exported: WeightUpdate,
    ) -> Result<Shipment> {
        let UpdatePayload::SharedRegion { region, tensors } = exported.payload else {
            return Err(PluginError::invalid_input(format!(
                "squeeze bridge (trainer side): got a `{}` export, it takes `shared_region`",
                exported.payload.kind().as_str()
            ))
            .with_help("the trainer must export shared_region updates (the native trainer does)"));
        };
        if let Some(v) = self.reserved {
            return Err(PluginError::invalid_state(format!(
                "squeeze bridge (trainer side): asked to ship v{} while the frames of v{v} still \
                 wait for that sync's outcome (after_apply)",
                exported.version
            ))
            .with_help("the host reports every sync's outcome before the next ship"));
        }
        let key = region.key.to_string();
        if !tensors.is_empty() {
            let new = (key.clone(), tensors.into_vec());
            if self.layout.as_ref() != Some(&new) {
                self.plan = None;
                self.layout = Some(new);
            }
        }
        let layout = match &self.layout {
            Some((k, t)) if *k == key => t,
            _ => {
                return Err(PluginError::invalid_state(format!(
                    "squeeze bridge: the trainer exported region {key} without its tensor \
                     layout, and this bridge never received it"
                ))
                .with_help("a trainer sends the layout with its first export of a region"));
            }
        };
        let plan = match &mut self.plan {
            Some(p) => p,
            slot => slot.insert(plan(layout, options.bucket_bytes)?),
        };
        if self.region.as_ref().is_some_and(|r| r.key() != key) {
            self.region = None;
        }
        let mapped = match &mut self.region {
            Some(r) => r,
            slot => slot.insert(Region::attach(host, &key)?),
        };
        let bytes = mapped.range(0, region.len).map_err(|e| {
            PluginError::invalid_input(format!(
                "squeeze bridge: the trainer exported region {key} as {} bytes: {}",
                region.len, e.message
            ))
        })?;

        let started = Instant::now();
        let n = plan.buckets.len();
        self.frames.resize_with(n, Packed::default);
        let threads = options.threads.min(n).max(1);
        self.packers.truncate(threads);
        while self.packers.len() < threads {
            self.packers.push(Packer::new(options.level)?);
        }
        compress_all(bytes, plan, &mut self.frames, &mut self.packers)?;
        let compress = started.elapsed();

        let frames = plan
            .buckets
            .iter()
            .zip(&plan.starts)
            .zip(&self.frames)
            .map(|((b, &start), f)| manifest::Frame {
                start,
                tensors: b.tensors.to_vec(),
                raw_bytes: b.bytes,
                wire_bytes: f.data.len() as u64,
                xxh3: f.checksum,
            })
            .collect();
        let m = Manifest {
            format: manifest::FORMAT.into(),
            version: exported.version,
            level: options.level,
            frames,
        };
        let (raw, wire) = (m.raw_bytes(), m.wire_bytes());
        self.manifest = m.to_bytes()?;
        self.reserved = Some(exported.version);
        self.stats.shipped += 1;
        self.stats.raw_bytes += raw;
        self.stats.wire_bytes += wire;
        self.stats.compress += compress;
        log(
            host,
            &format!(
                "squeeze bridge: v{} packs {raw} bytes into {wire} in {n} frames (ratio {:.3}, \
                 level {}, {:.3} s)",
                exported.version,
                raw as f64 / wire.max(1) as f64,
                options.level,
                compress.as_secs_f64()
            ),
        );
        Ok(Shipment {
            version: exported.version,
            digest: exported.digest,
            body: ShipmentBody::Owned {
                data: self.manifest.clone().into(),
                wire_bytes: wire,
            },
        })
    }

    /// Broadcasts the frames of `shipment` (what `ship` last returned) on [`BRIDGE_GROUP`]
    /// from rank 0, each exactly as its manifest sizes it.
    pub(crate) fn transmit(&mut self, host: &HostBox, shipment: &Shipment) -> Result<()> {
        let ShipmentBody::Owned { data, .. } = &shipment.body else {
            return Err(PluginError::invalid_input(format!(
                "squeeze bridge: `transmit` got a shipment of {}; it takes the manifest its \
                 trainer half shipped",
                shipment.kind_name()
            )));
        };
        if self.reserved != Some(shipment.version) || data.as_slice() != self.manifest.as_slice() {
            return Err(PluginError::invalid_state(format!(
                "squeeze bridge: asked to transmit v{}, but the frames this bridge holds are {}",
                shipment.version,
                self.reserved.map_or("released".to_owned(), |v| format!(
                    "v{v}'s (another manifest)"
                ))
            )));
        }
        let started = Instant::now();
        let group = RStr::from(BRIDGE_GROUP);
        let n = self.frames.len();
        for (k, f) in self.frames.iter_mut().enumerate() {
            let len = f.data.len();
            host.broadcast(group, 0, RSliceMut::from_mut_slice(&mut f.data))
                .into_result()
                .map_err(|e| {
                    PluginError::new(
                        e.code,
                        format!(
                            "squeeze bridge: sending frame {k} of {n} (v{}, {len} bytes) \
                             failed: {}",
                            shipment.version, e.message
                        ),
                    )
                    .with_help(e.help.as_str())
                })?;
        }
        self.stats.transmit += started.elapsed();
        Ok(())
    }

    /// The sync of `outcome.version` is over: its frames may be overwritten. An outcome of
    /// another version than the reserved one is an error (nothing reserved: nothing to do).
    pub(crate) fn after_apply(&mut self, host: &HostBox, outcome: &ApplyOutcome) -> Result<()> {
        match self.reserved {
            None => Ok(()),
            Some(v) if v == outcome.version => {
                self.reserved = None;
                if !outcome.applied {
                    log(
                        host,
                        &format!("squeeze bridge: the sync of v{v} failed; its frames released"),
                    );
                }
                Ok(())
            }
            Some(v) => Err(PluginError::invalid_state(format!(
                "squeeze bridge (trainer side): got the outcome of v{}, but the frames held are \
                 v{v}'s",
                outcome.version
            ))),
        }
    }
}

/// Buckets of `layout` of at most `bucket_bytes`, with their shuffle segments.
fn plan(layout: &[TensorSpec], bucket_bytes: u64) -> Result<Plan> {
    let (buckets, starts) = buckets::plan(layout, bucket_bytes);
    let segments = buckets
        .iter()
        .map(|b| {
            shuffle::segments(b).ok_or_else(|| {
                PluginError::invalid_input(
                    "squeeze bridge: the trainer's tensor layout has a tensor of no valid size",
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if buckets.is_empty() {
        return Err(PluginError::invalid_input(
            "squeeze bridge: the trainer's tensor layout lists no tensors",
        ));
    }
    Ok(Plan {
        buckets,
        starts,
        segments,
    })
}

/// Compresses bucket `k` of `plan` (bytes of `region`) into `frames[k]`, every bucket, on one
/// thread per packer (this one and `packers.len() - 1` more), each taking the next bucket.
fn compress_all(
    region: &[u8],
    plan: &Plan,
    frames: &mut [Packed],
    packers: &mut [Packer],
) -> Result<()> {
    let queue = Mutex::new(frames.iter_mut().enumerate());
    let work = |packer: &mut Packer| -> Result<()> {
        loop {
            let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
            let Some((k, frame)) = next else {
                return Ok(());
            };
            let (start, len) = (plan.starts[k], plan.buckets[k].bytes);
            let raw = usize::try_from(start)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(s, n)| region.get(s..s.checked_add(n)?))
                .ok_or_else(|| {
                    PluginError::invalid_input(format!(
                        "squeeze bridge: bucket {k} (bytes {start}..{}) lies outside the \
                         exported region ({} bytes)",
                        start.saturating_add(len),
                        region.len()
                    ))
                })?;
            packer.pack(raw, &plan.segments[k], &mut frame.data)?;
            frame.checksum = codec::checksum(&frame.data);
        }
    };
    let Some((first, rest)) = packers.split_first_mut() else {
        return Err(PluginError::runtime("squeeze bridge: no compressor"));
    };
    let work = &work;
    std::thread::scope(|s| {
        let others: Vec<_> = rest.iter_mut().map(|p| s.spawn(move || work(p))).collect();
        let mut result = work(first);
        for h in others {
            let r = h.join().unwrap_or_else(|_| {
                Err(PluginError::runtime(
                    "squeeze bridge: a compression thread panicked",
                ))
            });
            result = result.and(r);
        }
        result
    })
}
