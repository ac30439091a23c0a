//! The bridge through its ABI object against a host stand-in: a "trainer region" in this
//! process, broadcasts recorded (and failed on demand), log lines kept. An "engine" applies
//! what was broadcast the way the native engine does (trailer checked, tensors copied by
//! name), so each test can compare what the engine holds with the trainer's weights.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use crate::DeltaPlugin;
use tandem_plugin_api::abi_stable::sabi_trait::TD_Opaque;
use tandem_plugin_api::abi_stable::std_types::RArc;
use tandem_plugin_api::sdk::buckets::{self, TRAILER_BYTES};
use tandem_plugin_api::sdk::{self, Plugin};
use tandem_plugin_api::traits::{HostServices, HostServices_TO};
use tandem_plugin_api::{
    BridgeBox, BridgePlan, ComponentConfig, ComponentKind, DType, LogLevel, Metric, PResult,
    PluginError, RResult, RSlice, RSliceMut, RStr, RString, RVec, RegionInfo, RegionRequest,
    SharedRegionRef, TensorBucket, TensorSpec, UpdateKind, UpdatePayload, WeightUpdate,
};

const TENSORS: [&str; 5] = ["a", "b", "c", "d", "e"];
/// Each tensor: 256 f32 = 1 KiB, back to back (the smallest bucket_mb is 0.001 MiB).
const TENSOR_BYTES: usize = 1024;
const KEY: &str = "memfd:test:region";

#[derive(Default)]
struct State {
    /// The trainer's weights.
    region: Vec<u8>,
    /// Every broadcast buffer, in order.
    broadcasts: Vec<Vec<u8>>,
    /// The broadcast (counted from 0) that fails.
    fail_at: Option<usize>,
    logs: Vec<String>,
    attached: usize,
}

#[derive(Clone, Default)]
struct TestHost(Arc<Mutex<State>>);

impl TestHost {
    fn with_region() -> TestHost {
        let host = TestHost::default();
        host.state().region = (0..(TENSORS.len() * TENSOR_BYTES) as u32)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        host
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    fn handle(&self) -> tandem_plugin_api::HostBox {
        HostServices_TO::from_ptr(RArc::new(self.clone()), TD_Opaque)
    }

    /// A training step: one byte of each named tensor changes.
    fn train(&self, tensors: &[usize]) {
        let mut s = self.state();
        for &t in tensors {
            s.region[t * TENSOR_BYTES + 5] ^= 0x41;
        }
    }

    fn take_broadcasts(&self) -> Vec<Vec<u8>> {
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

fn config(options_json: &str) -> ComponentConfig {
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

fn bridge(host: &TestHost, options_json: &str) -> BridgeBox {
    DeltaPlugin::new_bridge(config(options_json), host.handle()).unwrap()
}

fn layout() -> RVec<TensorSpec> {
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
fn export(version: u64, with_layout: bool) -> WeightUpdate {
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

fn manifest(update: &WeightUpdate) -> Vec<TensorBucket> {
    match &update.payload {
        UpdatePayload::TensorBuckets { group, buckets } => {
            assert_eq!(group.as_str(), "bridge");
            buckets.to_vec()
        }
        other => panic!("expected tensor buckets, got {:?}", other.kind()),
    }
}

/// Tensor names per bucket.
fn names(buckets: &[TensorBucket]) -> Vec<Vec<String>> {
    buckets
        .iter()
        .map(|b| b.tensors.iter().map(|t| t.name.to_string()).collect())
        .collect()
}

/// What an engine does with the broadcasts of `shipped`: each bucket's trailer checked, its
/// tensors copied by name into `weights` (laid out as the trainer's region).
fn engine_apply(weights: &mut [u8], shipped: &WeightUpdate, broadcasts: &[Vec<u8>]) {
    let buckets = manifest(shipped);
    assert_eq!(
        broadcasts.len(),
        2 * buckets.len(),
        "data + trailer per bucket"
    );
    let full = layout();
    for (k, (bucket, pair)) in buckets.iter().zip(broadcasts.chunks(2)).enumerate() {
        let (data, trailer) = (&pair[0], &pair[1]);
        assert_eq!(data.len() as u64, bucket.bytes);
        let trailer: &[u8; TRAILER_BYTES] = trailer.as_slice().try_into().unwrap();
        buckets::check(data, trailer, shipped.version, k as u32).unwrap();
        for t in bucket.tensors.iter() {
            let at = full.iter().find(|f| f.name == t.name).unwrap().offset as usize;
            let (src, n) = (t.offset as usize, buckets::tensor_bytes(t) as usize);
            weights[at..at + n].copy_from_slice(&data[src..src + n]);
        }
    }
}

#[test]
fn the_first_sync_ships_everything_later_ones_only_what_changed() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    // The engine starts on other weights: only a full first sync makes it equal.
    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];

    let v1 = b.trainer_side(export(1, true)).into_result().unwrap();
    assert_eq!(names(&manifest(&v1)), [["a", "b", "c", "d", "e"]]);
    assert_eq!(
        v1.digest.as_str(),
        "digest-v1",
        "the digest travels as exported"
    );
    let before = host.state().region.clone();
    b.send(v1.clone()).into_result().unwrap();
    assert_eq!(
        host.state().region,
        before,
        "the trainer's region is never written"
    );
    engine_apply(&mut engine, &v1, &host.take_broadcasts());
    assert_eq!(engine, host.state().region);

    host.train(&[1, 3]);
    let v2 = b.trainer_side(export(2, false)).into_result().unwrap();
    assert_eq!(names(&manifest(&v2)), [["b"], ["d"]]);
    b.send(v2.clone()).into_result().unwrap();
    engine_apply(&mut engine, &v2, &host.take_broadcasts());
    assert_eq!(engine, host.state().region);

    // Nothing changed: an empty manifest, nothing broadcast.
    let v3 = b.trainer_side(export(3, false)).into_result().unwrap();
    assert!(manifest(&v3).is_empty());
    assert_eq!(v3.version, 3);
    b.send(v3).into_result().unwrap();
    assert!(host.take_broadcasts().is_empty());

    let logs = host.state().logs.clone();
    assert!(
        logs[0].contains("v1 ships 5 of 5 tensors, 5120 of 5120 bytes, in 1 buckets"),
        "{logs:?}"
    );
    assert!(logs[0].contains("first sync"), "{logs:?}");
    assert!(
        logs[1].contains("v2 ships 2 of 5 tensors, 2048 of 5120 bytes, in 2 buckets"),
        "{logs:?}"
    );
    assert!(logs[2].contains("v3 ships 0 of 5 tensors"), "{logs:?}");
    assert_eq!(host.state().attached, 1, "the region is mapped once");
}

#[test]
fn buckets_hold_at_most_bucket_mb() {
    let host = TestHost::with_region();
    // 2 KiB: two tensors a bucket.
    let b = bridge(
        &host,
        &format!(r#"{{"bucket_mb": {}}}"#, 2048.0 / 1048576.0),
    );
    let v1 = b.trainer_side(export(1, true)).into_result().unwrap();
    let m = manifest(&v1);
    assert_eq!(names(&m), [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
    assert!(m.iter().all(|b| b.bytes <= 2048));
    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];
    b.send(v1.clone()).into_result().unwrap();
    engine_apply(&mut engine, &v1, &host.take_broadcasts());
    assert_eq!(engine, host.state().region);
}

#[test]
fn a_failed_send_names_the_bucket_and_the_next_sync_ships_everything() {
    let host = TestHost::with_region();
    // 0.001 MiB = 1048 bytes: one tensor a bucket.
    let b = bridge(&host, r#"{"bucket_mb": 0.001}"#);
    let v1 = b.trainer_side(export(1, true)).into_result().unwrap();
    b.send(v1).into_result().unwrap();
    host.take_broadcasts();

    host.train(&[0, 1, 2]);
    let v2 = b.trainer_side(export(2, false)).into_result().unwrap();
    assert_eq!(manifest(&v2).len(), 3);
    // Broadcast 2 = bucket 1's data (bucket 0 = broadcasts 0 and 1).
    host.state().fail_at = Some(2);
    let e = b.send(v2).into_result().unwrap_err();
    assert!(
        e.message
            .contains("sending bucket 1 of 3 (v2, 1024 bytes) failed"),
        "{e}"
    );
    assert!(e.message.contains("peer 1 died"), "{e}");
    assert!(!e.message.contains('\n'), "one line: {e}");
    host.state().fail_at = None;
    host.take_broadcasts();

    // Unchanged since v2, yet an engine may hold part of v2: everything ships.
    let v3 = b.trainer_side(export(3, false)).into_result().unwrap();
    let shipped: usize = manifest(&v3).iter().map(|b| b.tensors.len()).sum();
    assert_eq!(shipped, TENSORS.len());
}

#[test]
fn a_plan_that_was_never_sent_is_no_baseline() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let v1 = b.trainer_side(export(1, true)).into_result().unwrap();
    b.send(v1).into_result().unwrap();
    host.train(&[4]);
    // v2 planned, never sent; v3 must still carry e.
    b.trainer_side(export(2, false)).into_result().unwrap();
    let v3 = b.trainer_side(export(3, false)).into_result().unwrap();
    assert_eq!(names(&manifest(&v3)), [["e"]]);
}

#[test]
fn send_refuses_a_manifest_its_trainer_half_did_not_plan() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let stray = WeightUpdate {
        version: 1,
        digest: "".into(),
        payload: UpdatePayload::TensorBuckets {
            group: "bridge".into(),
            buckets: RVec::new(),
        },
    };
    let e = b.send(stray).into_result().unwrap_err();
    assert!(e.message.contains("last planned nothing"), "{e}");
    let v1 = b.trainer_side(export(1, true)).into_result().unwrap();
    let mut other = v1.clone();
    other.version = 9;
    let e = b.send(other).into_result().unwrap_err();
    assert!(e.message.contains("asked to send v9"), "{e}");
    assert!(e.message.contains("last planned v1 (1 buckets)"), "{e}");
    assert!(host.take_broadcasts().is_empty());
}

#[test]
fn an_unseen_region_without_its_layout_and_wrong_kinds_are_refused() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let e = b.trainer_side(export(1, false)).into_result().unwrap_err();
    assert!(e.message.contains("without its tensor layout"), "{e}");

    let buckets = WeightUpdate {
        version: 1,
        digest: "".into(),
        payload: UpdatePayload::TensorBuckets {
            group: "bridge".into(),
            buckets: RVec::new(),
        },
    };
    let e = b.trainer_side(buckets.clone()).into_result().unwrap_err();
    assert!(
        e.message.contains("(trainer side): got a `tensor_buckets`"),
        "{e}"
    );
    let e = b.engine_side(export(1, true)).into_result().unwrap_err();
    assert!(
        e.message.contains("(engine side): got a `shared_region`"),
        "{e}"
    );
    let passed = b.engine_side(buckets.clone()).into_result().unwrap();
    assert_eq!(
        passed, buckets,
        "the engine half passes the manifest through"
    );
}

#[test]
fn the_plan_asks_for_the_transport_only() {
    let host = TestHost::default();
    let plan = bridge(&host, "").plan().into_result().unwrap();
    assert_eq!(
        plan,
        BridgePlan {
            transport: true,
            ..BridgePlan::default()
        }
    );
}

#[test]
fn the_manifest_declares_one_bridge_and_options_are_checked_by_both_entry_points() {
    let m = sdk::manifest("x", "0", Vec::new());
    let ours = DeltaPlugin::manifest();
    assert_eq!(ours.api_level, m.api_level, "built at this API's level");
    assert_eq!(ours.name.as_str(), "example-delta");
    assert_eq!(ours.components.len(), 1);
    let c = &ours.components[0];
    assert_eq!((c.kind, c.name.as_str()), (ComponentKind::Bridge, "delta"));
    assert_eq!(
        c.caps.update_kinds.as_slice(),
        [UpdateKind::SharedRegion, UpdateKind::TensorBuckets]
    );

    let bad = config(r#"{"bucket_mb": "x"}"#);
    let problems = DeltaPlugin::validate_config(ComponentKind::Bridge, &bad);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].key.as_str(), "bucket_mb");
    let e = match DeltaPlugin::new_bridge(bad, TestHost::default().handle()) {
        Ok(_) => panic!("a bad bucket_mb constructed a bridge"),
        Err(e) => e,
    };
    assert!(e.message.starts_with("bridge.options.bucket_mb: "), "{e}");
    let unknown = config(r#"{"zip": 1}"#);
    let problems = DeltaPlugin::validate_config(ComponentKind::Bridge, &unknown);
    assert_eq!(problems[0].key.as_str(), "zip");
    assert!(DeltaPlugin::validate_config(ComponentKind::Bridge, &config("")).is_empty());
    let problems = DeltaPlugin::validate_config(ComponentKind::Engine, &config(""));
    assert!(
        problems[0].message.contains("no engine components"),
        "{problems:?}"
    );
}
