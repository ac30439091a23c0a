//! The stand-in host of the `delta` bridge's tests: a "trainer region" in this process,
//! broadcasts recorded (and failed on demand), log lines kept, a sink that counts its calls;
//! and an "engine" that applies what was broadcast the way the native engine does (trailer
//! checked, tensors copied by name).

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use crate::DeltaPlugin;
use tandem_plugin_api::abi_stable::sabi_trait::TD_Opaque;
use tandem_plugin_api::abi_stable::std_types::RArc;
use tandem_plugin_api::sdk::Plugin;
use tandem_plugin_api::sdk::buckets::{self, TRAILER_BYTES};
use tandem_plugin_api::traits::{HostServices, HostServices_TO, TensorSink, TensorSink_TO};
use tandem_plugin_api::{
    ApplyOutcome, BridgeBox, ComponentConfig, DType, LogLevel, Metric, PResult, PlacedBucket,
    PluginError, RResult, RSlice, RSliceMut, RStr, RString, RVec, RegionInfo, RegionRequest,
    SharedRegionRef, Shipment, ShipmentBody, SinkBox, TensorBucket, TensorSpec, UpdatePayload,
    WeightUpdate,
};

pub(super) const TENSORS: [&str; 5] = ["a", "b", "c", "d", "e"];
/// Each tensor: 256 f32 = 1 KiB, back to back (the smallest bucket_mb is 0.001 MiB).
pub(super) const TENSOR_BYTES: usize = 1024;
const KEY: &str = "memfd:test:region";

#[derive(Default)]
pub(super) struct State {
    /// The trainer's weights.
    pub(super) region: Vec<u8>,
    /// Every broadcast buffer, in order.
    pub(super) broadcasts: Vec<Vec<u8>>,
    /// The broadcast (counted from 0) that fails.
    pub(super) fail_at: Option<usize>,
    pub(super) logs: Vec<String>,
    pub(super) attached: usize,
}

#[derive(Clone, Default)]
pub(super) struct TestHost(Arc<Mutex<State>>);

impl TestHost {
    pub(super) fn with_region() -> TestHost {
        let host = TestHost::default();
        host.state().region = (0..(TENSORS.len() * TENSOR_BYTES) as u32)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        host
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    pub(super) fn handle(&self) -> tandem_plugin_api::HostBox {
        HostServices_TO::from_ptr(RArc::new(self.clone()), TD_Opaque)
    }

    /// A training step: one byte of each named tensor changes.
    pub(super) fn train(&self, tensors: &[usize]) {
        let mut s = self.state();
        for &t in tensors {
            s.region[t * TENSOR_BYTES + 5] ^= 0x41;
        }
    }

    pub(super) fn take_broadcasts(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.state().broadcasts)
    }
}

fn unsupported<T>(what: &str) -> PResult<T> {
    RResult::RErr(PluginError::not_supported(what, "the test host"))
}

impl HostServices for TestHost {
    fn log(&self, _level: LogLevel, _target: RStr<'_>, message: RStr<'_>) {
        self.state().logs.push(message.to_string());
    }
    fn is_cancelled(&self) -> bool {
        false
    }
    fn alloc_region(&self, _request: RegionRequest) -> PResult<RegionInfo> {
        unsupported("alloc_region")
    }
    fn free_region(&self, _id: u64) -> PResult<()> {
        RResult::ROk(())
    }
    fn attach_region(&self, key: RString) -> PResult<RegionInfo> {
        let mut s = self.state();
        if key.as_str() != KEY {
            return RResult::RErr(PluginError::invalid_input(format!("no region {key}")));
        }
        s.attached += 1;
        RResult::ROk(RegionInfo {
            id: 1,
            key,
            addr: s.region.as_ptr() as usize,
            len: s.region.len() as u64,
        })
    }
    fn pause_tags(&self, _tags: RVec<RString>) -> PResult<()> {
        unsupported("pause_tags")
    }
    fn resume_tags(&self, _tags: RVec<RString>) -> PResult<()> {
        unsupported("resume_tags")
    }
    fn snapshot(&self, _name: RString, _tags: RVec<RString>) -> PResult<()> {
        unsupported("snapshot")
    }
    fn restore(&self, _name: RString) -> PResult<()> {
        unsupported("restore")
    }
    fn drop_snapshot(&self, _name: RString) -> PResult<()> {
        unsupported("drop_snapshot")
    }
    fn memory_stats(&self) -> PResult<RVec<Metric>> {
        unsupported("memory_stats")
    }
    fn send(&self, _group: RStr<'_>, _dst: u32, _data: RSlice<'_, u8>, _tag: u64) -> PResult<()> {
        unsupported("send")
    }
    fn recv(&self, _group: RStr<'_>, _src: u32, _buf: RSliceMut<'_, u8>, _tag: u64) -> PResult<()> {
        unsupported("recv")
    }
    fn broadcast(&self, group: RStr<'_>, root: u32, buf: RSliceMut<'_, u8>) -> PResult<()> {
        let mut s = self.state();
        assert_eq!((group.as_str(), root), ("bridge", 0));
        if s.fail_at == Some(s.broadcasts.len()) {
            return RResult::RErr(PluginError::new(
                tandem_plugin_api::ErrorCode::Unavailable,
                "transport group `bridge`: peer 1 died",
            ));
        }
        s.broadcasts.push(buf.as_slice().to_vec());
        RResult::ROk(())
    }
}

pub(super) fn config(options_json: &str) -> ComponentConfig {
    ComponentConfig {
        component: "delta".into(),
        model_path: "".into(),
        options_json: options_json.into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    }
}

pub(super) fn bridge(host: &TestHost, options_json: &str) -> BridgeBox {
    DeltaPlugin::new_bridge(config(options_json), host.handle()).unwrap()
}

pub(super) fn layout() -> RVec<TensorSpec> {
    TENSORS
        .iter()
        .enumerate()
        .map(|(i, n)| TensorSpec {
            name: (*n).into(),
            dtype: DType::F32,
            shape: RVec::from(vec![(TENSOR_BYTES / 4) as u64]),
            offset: (i * TENSOR_BYTES) as u64,
        })
        .collect()
}

/// The trainer's export of version `version`: the layout on the first export only.
pub(super) fn export(version: u64, with_layout: bool) -> WeightUpdate {
    WeightUpdate {
        version,
        digest: format!("digest-v{version}").into(),
        payload: UpdatePayload::SharedRegion {
            region: SharedRegionRef {
                key: KEY.into(),
                device: "cpu".into(),
                len: (TENSORS.len() * TENSOR_BYTES) as u64,
            },
            tensors: if with_layout { layout() } else { RVec::new() },
        },
    }
}

/// A sink that counts the calls it gets: the delta's engine half hands the engine an update
/// and never uses it.
struct CountingSink(Arc<Mutex<usize>>);

impl TensorSink for CountingSink {
    fn begin(&mut self, _buckets: RVec<TensorBucket>) -> PResult<()> {
        *self.0.lock().unwrap() += 1;
        RResult::ROk(())
    }
    fn put(&mut self, _data: RSlice<'_, u8>) -> PResult<()> {
        *self.0.lock().unwrap() += 1;
        RResult::ROk(())
    }
}

pub(super) fn sink(calls: &Arc<Mutex<usize>>) -> SinkBox {
    TensorSink_TO::from_value(CountingSink(calls.clone()), TD_Opaque)
}

/// The placed buckets of a shipment, on the bridge group.
pub(super) fn placed(shipment: &Shipment) -> Vec<PlacedBucket> {
    match &shipment.body {
        ShipmentBody::Buckets { group, buckets } => {
            assert_eq!(group.as_str(), "bridge");
            buckets.to_vec()
        }
        other => panic!("expected placed buckets, got {other:?}"),
    }
}

pub(super) fn manifest(shipment: &Shipment) -> Vec<TensorBucket> {
    placed(shipment).into_iter().map(|p| p.bucket).collect()
}

/// Tensor names per bucket.
pub(super) fn names(buckets: &[TensorBucket]) -> Vec<Vec<String>> {
    buckets
        .iter()
        .map(|b| b.tensors.iter().map(|t| t.name.to_string()).collect())
        .collect()
}

/// What an engine does with the broadcasts of `shipped`: each bucket's trailer checked, its
/// tensors copied by name into `weights` (laid out as the trainer's region). Each bucket's
/// start is where its tensors lie in the trainer's layout.
pub(super) fn engine_apply(weights: &mut [u8], shipped: &Shipment, broadcasts: &[Vec<u8>]) {
    let placed = placed(shipped);
    assert_eq!(
        broadcasts.len(),
        2 * placed.len(),
        "data + trailer per bucket"
    );
    let full = layout();
    for (k, (p, pair)) in placed.iter().zip(broadcasts.chunks(2)).enumerate() {
        let (data, trailer) = (&pair[0], &pair[1]);
        assert_eq!(data.len() as u64, p.bucket.bytes);
        let trailer: &[u8; TRAILER_BYTES] = trailer.as_slice().try_into().unwrap();
        buckets::check(data, trailer, shipped.version, k as u32).unwrap();
        for t in p.bucket.tensors.iter() {
            let at = full.iter().find(|f| f.name == t.name).unwrap().offset;
            assert_eq!(p.start + t.offset, at, "bucket {k} places `{}`", t.name);
            let (src, n) = (t.offset as usize, buckets::tensor_bytes(t) as usize);
            weights[at as usize..at as usize + n].copy_from_slice(&data[src..src + n]);
        }
    }
}

pub(super) fn outcome(version: u64, applied: bool) -> ApplyOutcome {
    ApplyOutcome { version, applied }
}

/// One whole sync of `version`: ship, transmit, the engine applies, every engine verified.
pub(super) fn sync(b: &BridgeBox, host: &TestHost, engine: &mut [u8], version: u64) -> Shipment {
    let shipped = b.ship(export(version, version == 1)).into_result().unwrap();
    b.transmit(shipped.clone()).into_result().unwrap();
    engine_apply(engine, &shipped, &host.take_broadcasts());
    b.after_apply(outcome(version, true)).into_result().unwrap();
    shipped
}

/// The tensors a shipment carries, in all.
pub(super) fn tensor_count(shipment: &Shipment) -> usize {
    manifest(shipment).iter().map(|b| b.tensors.len()).sum()
}
