//! The bridge through its ABI object against host stand-ins: a "trainer" host holding a
//! weights region and recording every broadcast (failing one on demand), and an "engine"
//! host whose broadcasts hand over the recorded frames in order. A recording sink stands for
//! the engine's bucket path, so each test can rebuild the engine's weights from what the
//! engine half put and compare them with the trainer's.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::SqueezePlugin;
use tandem_plugin_api::abi_stable::sabi_trait::TD_Opaque;
use tandem_plugin_api::abi_stable::std_types::RArc;
use tandem_plugin_api::sdk::Plugin;
use tandem_plugin_api::traits::{HostServices, HostServices_TO, TensorSink, TensorSink_TO};
use tandem_plugin_api::{
    ApplyOutcome, BridgeBox, ComponentConfig, DType, ErrorCode, LogLevel, Metric, PResult,
    PluginError, RResult, RSlice, RSliceMut, RStr, RString, RVec, Received, RegionInfo,
    RegionRequest, SharedRegionRef, Shipment, ShipmentBody, SinkBox, TensorBucket, TensorSpec,
    UpdatePayload, WeightUpdate,
};

const KEY: &str = "memfd:test:weights";
/// Tensors: (name, dtype, elements). 6 KiB + 1 KiB + 1 KiB + 8 bytes.
const TENSORS: [(&str, DType, usize); 4] = [
    ("embed", DType::F32, 1536),
    ("norm", DType::BF16, 512),
    ("proj", DType::F32, 256),
    ("step", DType::I64, 1),
];

#[derive(Default)]
struct State {
    region: Vec<u8>,
    /// Trainer host: every broadcast buffer, in order.
    sent: Vec<Vec<u8>>,
    /// Engine host: what its broadcasts receive, in order.
    incoming: VecDeque<Vec<u8>>,
    fail_at: Option<usize>,
    logs: Vec<String>,
}

#[derive(Clone, Default)]
struct TestHost(Arc<Mutex<State>>);

impl TestHost {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    fn handle(&self) -> tandem_plugin_api::HostBox {
        HostServices_TO::from_ptr(RArc::new(self.clone()), TD_Opaque)
    }
}

/// The trainer's weights: small floats (as a trained model's), whose high bytes repeat.
fn weights(seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    let mut next = move || {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
        ((x >> 8) as f32 / 16777216.0 - 0.5) * 0.1
    };
    let mut out = Vec::new();
    for (_, dtype, n) in TENSORS {
        for _ in 0..n {
            match dtype {
                DType::F32 => out.extend(next().to_le_bytes()),
                DType::BF16 => out.extend(&next().to_le_bytes()[2..]),
                _ => out.extend((seed as i64).to_le_bytes()),
            }
        }
    }
    out
}

fn layout() -> RVec<TensorSpec> {
    let mut offset = 0;
    TENSORS
        .iter()
        .map(|&(name, dtype, n)| {
            let t = TensorSpec {
                name: name.into(),
                dtype,
                shape: RVec::from(vec![n as u64]),
                offset,
            };
            offset += (n * dtype.size()) as u64;
            t
        })
        .collect()
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
        let s = self.state();
        if key.as_str() != KEY || s.region.is_empty() {
            return RResult::RErr(PluginError::invalid_input(format!("no region {key}")));
        }
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
    fn broadcast(&self, group: RStr<'_>, root: u32, mut buf: RSliceMut<'_, u8>) -> PResult<()> {
        let mut s = self.state();
        assert_eq!((group.as_str(), root), ("bridge", 0));
        if !s.region.is_empty() {
            if s.fail_at == Some(s.sent.len()) {
                return RResult::RErr(PluginError::new(
                    ErrorCode::Unavailable,
                    "transport group `bridge`: peer 1 died",
                ));
            }
            s.sent.push(buf.as_slice().to_vec());
            return RResult::ROk(());
        }
        match s.incoming.pop_front() {
            Some(frame) if frame.len() == buf.len() => {
                buf.as_mut_slice().copy_from_slice(&frame);
                RResult::ROk(())
            }
            other => RResult::RErr(PluginError::runtime(format!(
                "broadcast of {} bytes, the root sent {:?}",
                buf.len(),
                other.map(|f| f.len())
            ))),
        }
    }
}

/// What the engine's sink got: the buckets announced, the bytes put.
#[derive(Default)]
struct Got {
    buckets: Vec<TensorBucket>,
    puts: Vec<Vec<u8>>,
}

struct RecordingSink(Arc<Mutex<Got>>);

impl TensorSink for RecordingSink {
    fn begin(&mut self, buckets: RVec<TensorBucket>) -> PResult<()> {
        self.0.lock().unwrap().buckets = buckets.into_vec();
        RResult::ROk(())
    }
    fn put(&mut self, data: RSlice<'_, u8>) -> PResult<()> {
        self.0.lock().unwrap().puts.push(data.to_vec());
        RResult::ROk(())
    }
}

fn sink(got: &Arc<Mutex<Got>>) -> SinkBox {
    TensorSink_TO::from_value(RecordingSink(got.clone()), TD_Opaque)
}

fn bridge(host: &TestHost, options_json: &str) -> BridgeBox {
    let config = ComponentConfig {
        component: "squeeze".into(),
        model_path: "".into(),
        options_json: options_json.into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    };
    SqueezePlugin::new_bridge(config, host.handle()).unwrap()
}

/// A trainer (host and bridge) over `weights(1)`, and an engine (host and bridge).
struct Pair {
    trainer_host: TestHost,
    trainer: BridgeBox,
    engine_host: TestHost,
    engine: BridgeBox,
}

fn pair(options_json: &str) -> Pair {
    let trainer_host = TestHost::default();
    trainer_host.state().region = weights(1);
    let engine_host = TestHost::default();
    Pair {
        trainer: bridge(&trainer_host, options_json),
        engine: bridge(&engine_host, options_json),
        trainer_host,
        engine_host,
    }
}

fn export(version: u64, with_layout: bool) -> WeightUpdate {
    WeightUpdate {
        version,
        digest: format!("st256:v{version}").into(),
        payload: UpdatePayload::SharedRegion {
            region: SharedRegionRef {
                key: KEY.into(),
                device: "cpu".into(),
                len: weights(1).len() as u64,
            },
            tensors: if with_layout { layout() } else { RVec::new() },
        },
    }
}

fn outcome(version: u64, applied: bool) -> ApplyOutcome {
    ApplyOutcome { version, applied }
}

impl Pair {
    /// Ships and transmits `version`; the frames go to the engine host.
    fn ship(&self, version: u64, with_layout: bool) -> Shipment {
        let shipment = self
            .trainer
            .ship(export(version, with_layout))
            .into_result()
            .unwrap();
        self.trainer
            .transmit(shipment.clone())
            .into_result()
            .unwrap();
        let frames = std::mem::take(&mut self.trainer_host.state().sent);
        self.engine_host.state().incoming.extend(frames);
        shipment
    }

    /// The engine's weights rebuilt from what its sink got, each tensor placed at its layout
    /// offset.
    fn receive(&self, shipment: Shipment) -> PResult<Vec<u8>> {
        let got = Arc::new(Mutex::new(Got::default()));
        let received = self.engine.receive(shipment, sink(&got));
        let got = got.lock().unwrap();
        received.map(|r| {
            assert_eq!(r, Received::Decoded);
            assert_eq!(got.buckets.len(), got.puts.len(), "every bucket put");
            let mut rebuilt = vec![0u8; weights(1).len()];
            for (b, data) in got.buckets.iter().zip(&got.puts) {
                assert_eq!(b.bytes, data.len() as u64);
                for t in b.tensors.iter() {
                    let at = layout().iter().find(|l| l.name == t.name).unwrap().offset as usize;
                    let n = (t.shape[0] as usize) * t.dtype.size();
                    let from = t.offset as usize;
                    rebuilt[at..at + n].copy_from_slice(&data[from..from + n]);
                }
            }
            rebuilt
        })
    }

    fn after_apply(&self, version: u64) {
        self.engine
            .after_apply(outcome(version, true))
            .into_result()
            .unwrap();
        self.trainer
            .after_apply(outcome(version, true))
            .into_result()
            .unwrap();
    }
}

fn wire_bytes(s: &Shipment) -> u64 {
    match &s.body {
        ShipmentBody::Owned { wire_bytes, .. } => *wire_bytes,
        other => panic!("not an owned payload: {other:?}"),
    }
}

fn stat(m: &[Metric], name: &str) -> f64 {
    m.iter()
        .find(|m| m.name == name)
        .map(|m| m.value)
        .unwrap_or_else(|| panic!("no {name}: {m:?}"))
}

#[test]
fn two_syncs_deliver_the_trainers_weights_bit_for_bit_and_compressed() {
    for options in [
        r#"{"bucket_mb": 0.001}"#,
        r#"{"bucket_mb": 0.001, "threads": 3}"#,
        "{}",
    ] {
        let p = pair(options);
        let s1 = p.ship(1, true);
        assert_eq!((s1.version, s1.digest.as_str()), (1, "st256:v1"));
        let wire = wire_bytes(&s1);
        let raw = weights(1).len() as u64;
        assert!(
            wire < raw * 95 / 100,
            "{options}: {wire} of {raw} bytes on the wire"
        );
        let sent: u64 = p
            .engine_host
            .state()
            .incoming
            .iter()
            .map(|f| f.len() as u64)
            .sum();
        assert_eq!(
            sent, wire,
            "{options}: the manifest's accounting is what travels"
        );
        assert_eq!(p.receive(s1).unwrap(), weights(1), "{options}");
        p.after_apply(1);

        // A training step; the second export carries no layout.
        p.trainer_host.state().region.copy_from_slice(&weights(2));
        let s2 = p.ship(2, false);
        assert_eq!(p.receive(s2).unwrap(), weights(2), "{options}");
        p.after_apply(2);

        let t = p.trainer.stats().into_result().unwrap();
        assert_eq!(stat(&t, "raw_bytes"), 2.0 * raw as f64, "{options}");
        assert!(stat(&t, "ratio") > 1.05, "{options}: {t:?}");
        let e = p.engine.stats().into_result().unwrap();
        assert!(stat(&e, "decompress_s") >= 0.0);
        assert!(
            e.iter().all(|m| m.name != "ratio"),
            "engines report no ratio: {e:?}"
        );
        assert!(
            p.trainer.stats().into_result().unwrap().is_empty(),
            "since the last call"
        );
    }
}

#[test]
fn a_ship_before_the_last_syncs_outcome_is_refused_then_allowed_after_it() {
    let p = pair(r#"{"bucket_mb": 0.001}"#);
    let s1 = p.ship(1, true);
    let e = p.trainer.ship(export(2, false)).into_result().unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidState);
    assert!(
        e.message
            .contains("ship v2 while the frames of v1 still wait"),
        "{e}"
    );
    // The engine's apply failed: its buffers and the trainer's frames are released all the
    // same, and the next sync goes through.
    p.receive(s1).unwrap();
    p.engine
        .after_apply(outcome(1, false))
        .into_result()
        .unwrap();
    p.trainer
        .after_apply(outcome(1, false))
        .into_result()
        .unwrap();
    assert!(
        p.trainer_host
            .state()
            .logs
            .iter()
            .any(|l| l.contains("sync of v1 failed"))
    );
    let s2 = p.ship(2, false);
    assert_eq!(p.receive(s2).unwrap(), weights(1));
    // An outcome of another version than the one held is an error.
    let e = p
        .trainer
        .after_apply(outcome(7, true))
        .into_result()
        .unwrap_err();
    assert!(
        e.message
            .contains("outcome of v7, but the frames held are v2's"),
        "{e}"
    );
}

#[test]
fn a_receive_before_the_last_applys_outcome_is_refused() {
    let p = pair(r#"{"bucket_mb": 0.001}"#);
    let s1 = p.ship(1, true);
    p.receive(s1.clone()).unwrap();
    let e = p.receive(s1).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidState);
    assert!(
        e.message
            .contains("receive v1 while the buffers of v1 still wait"),
        "{e}"
    );
}

#[test]
fn a_damaged_frame_is_refused_and_the_rest_still_received() {
    let p = pair(r#"{"bucket_mb": 0.001}"#);
    let s1 = p.ship(1, true);
    let frames = p.engine_host.state().incoming.len();
    assert!(frames >= 3, "several frames: {frames}");
    p.engine_host.state().incoming[1][3] ^= 0x10;
    let e = p.receive(s1).unwrap_err();
    assert_eq!(e.code, ErrorCode::Corrupt);
    assert!(
        e.message.contains(&format!(
            "frame 1 of {frames} (v1): its checksum does not match"
        )),
        "{e}"
    );
    assert!(
        p.engine_host.state().incoming.is_empty(),
        "every frame was received"
    );
}

#[test]
fn what_is_not_this_bridges_manifest_is_one_error_line() {
    let p = pair("");
    let region = Shipment::from_update(export(1, true));
    let e = p.receive(region).unwrap_err();
    assert!(e.message.contains("got a shipment of shared_region"), "{e}");
    let junk = Shipment {
        version: 1,
        digest: "".into(),
        body: ShipmentBody::Owned {
            data: RVec::from(b"not json".to_vec()),
            wire_bytes: 8,
        },
    };
    let e = p.receive(junk).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidInput);
    assert!(
        e.message.contains("v1 is not a squeeze manifest (8 bytes)"),
        "{e}"
    );
    assert!(!e.message.contains('\n'));
}

#[test]
fn the_trainer_half_takes_a_shared_region_and_transmits_only_what_it_shipped() {
    let p = pair("");
    let mut checkpoint = export(1, true);
    checkpoint.payload = UpdatePayload::CheckpointDir { dir: "/x".into() };
    let e = p.trainer.ship(checkpoint).into_result().unwrap_err();
    assert!(e.message.contains("got a `checkpoint_dir` export"), "{e}");
    let e = p.trainer.ship(export(1, false)).into_result().unwrap_err();
    assert!(e.message.contains("without its tensor layout"), "{e}");

    let mut s1 = p.trainer.ship(export(1, true)).into_result().unwrap();
    s1.version = 5;
    let e = p.trainer.transmit(s1).into_result().unwrap_err();
    assert!(e.message.contains("asked to transmit v5"), "{e}");
}

#[test]
fn a_failed_broadcast_names_the_frame() {
    let p = pair(r#"{"bucket_mb": 0.001}"#);
    p.trainer_host.state().fail_at = Some(1);
    let s1 = p.trainer.ship(export(1, true)).into_result().unwrap();
    let e = p.trainer.transmit(s1).into_result().unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(e.message.contains("sending frame 1 of"), "{e}");
    assert!(e.message.contains("peer 1 died"), "{e}");
}
