//! The bridge through its ABI object (the level-7 calls) against a host stand-in
//! ([`stand_in`]): each test compares what the "engine" holds with the trainer's weights;
//! the host's verdict on a sync is `after_apply`'s outcome.

#![allow(clippy::unwrap_used)]

mod stand_in;

use std::sync::{Arc, Mutex};

use crate::DeltaPlugin;
use stand_in::{
    TENSOR_BYTES, TENSORS, TestHost, bridge, config, export, manifest, names, outcome, placed,
    sink, sync, tensor_count,
};
use tandem_plugin_api::sdk::{self, Plugin};
use tandem_plugin_api::{
    BridgePlan, ComponentKind, Metric, PlacedBucket, RVec, Received, Shipment, ShipmentBody,
    UpdateKind, UpdatePayload, WeightUpdate,
};

#[test]
fn the_first_sync_ships_everything_later_ones_only_what_changed() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    // The engine starts on other weights: only a full first sync makes it equal.
    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];

    let before = host.state().region.clone();
    let v1 = sync(&b, &host, &mut engine, 1);
    assert_eq!(names(&manifest(&v1)), [["a", "b", "c", "d", "e"]]);
    assert_eq!(
        v1.digest.as_str(),
        "digest-v1",
        "the digest travels as exported"
    );
    assert_eq!(
        host.state().region,
        before,
        "the trainer's region is never written"
    );
    assert_eq!(engine, host.state().region);

    host.train(&[1, 3]);
    let v2 = sync(&b, &host, &mut engine, 2);
    assert_eq!(names(&manifest(&v2)), [["b"], ["d"]]);
    assert_eq!(engine, host.state().region);

    // Nothing changed: no buckets, nothing broadcast.
    let v3 = b.ship(export(3, false)).into_result().unwrap();
    assert!(manifest(&v3).is_empty());
    assert_eq!(v3.version, 3);
    b.transmit(v3).into_result().unwrap();
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
fn buckets_hold_at_most_bucket_mb_and_start_where_their_tensors_lie() {
    let host = TestHost::with_region();
    // 2 KiB: two tensors a bucket.
    let b = bridge(
        &host,
        &format!(r#"{{"bucket_mb": {}}}"#, 2048.0 / 1048576.0),
    );
    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];
    let v1 = sync(&b, &host, &mut engine, 1);
    let m = manifest(&v1);
    assert_eq!(names(&m), [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
    assert!(m.iter().all(|b| b.bytes <= 2048));
    let starts: Vec<u64> = placed(&v1).iter().map(|p| p.start).collect();
    assert_eq!(starts, [0, 2048, 4096]);
    assert_eq!(v1.wire_bytes(), Some(5120), "the host's byte count");
    assert_eq!(engine, host.state().region);
}

#[test]
fn a_failed_transmit_names_the_bucket_and_the_next_sync_ships_everything() {
    let host = TestHost::with_region();
    // 0.001 MiB = 1048 bytes: one tensor a bucket.
    let b = bridge(&host, r#"{"bucket_mb": 0.001}"#);
    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];
    sync(&b, &host, &mut engine, 1);

    host.train(&[0, 1, 2]);
    let v2 = b.ship(export(2, false)).into_result().unwrap();
    assert_eq!(manifest(&v2).len(), 3);
    // Broadcast 2 = bucket 1's data (bucket 0 = broadcasts 0 and 1).
    host.state().fail_at = Some(2);
    let e = b.transmit(v2).into_result().unwrap_err();
    assert!(
        e.message
            .contains("sending bucket 1 of 3 (v2, 1024 bytes) failed"),
        "{e}"
    );
    assert!(e.message.contains("peer 1 died"), "{e}");
    assert!(!e.message.contains('\n'), "one line: {e}");
    host.state().fail_at = None;
    host.take_broadcasts();
    b.after_apply(outcome(2, false)).into_result().unwrap();

    // Unchanged since v2, yet an engine may hold part of v2: everything ships.
    let v3 = b.ship(export(3, false)).into_result().unwrap();
    assert_eq!(tensor_count(&v3), TENSORS.len());
}

#[test]
fn the_baseline_is_adopted_only_when_every_engine_applied_the_planned_version() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];
    sync(&b, &host, &mut engine, 1);

    // v2 went out whole, but an engine failed to apply it (or was not verified).
    host.train(&[2]);
    let v2 = b.ship(export(2, false)).into_result().unwrap();
    assert_eq!(names(&manifest(&v2)), [["c"]]);
    b.transmit(v2).into_result().unwrap();
    host.take_broadcasts();
    b.after_apply(outcome(2, false)).into_result().unwrap();
    let v3 = b.ship(export(3, false)).into_result().unwrap();
    assert_eq!(
        tensor_count(&v3),
        TENSORS.len(),
        "a failed apply: everything"
    );

    // An outcome of another version than the planned one is no verdict on the plan.
    b.transmit(v3).into_result().unwrap();
    host.take_broadcasts();
    b.after_apply(outcome(2, true)).into_result().unwrap();
    let v4 = b.ship(export(4, false)).into_result().unwrap();
    assert_eq!(
        tensor_count(&v4),
        TENSORS.len(),
        "another version: everything"
    );

    // Applied and verified: the next delta is against v4.
    b.transmit(v4).into_result().unwrap();
    host.take_broadcasts();
    b.after_apply(outcome(4, true)).into_result().unwrap();
    let v5 = b.ship(export(5, false)).into_result().unwrap();
    assert!(manifest(&v5).is_empty());
}

#[test]
fn a_plan_never_transmitted_keeps_the_baseline_one_without_an_outcome_clears_it() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];
    sync(&b, &host, &mut engine, 1);
    host.train(&[4]);
    // v2 planned, never transmitted: v3 is still a delta against v1, and carries e.
    b.ship(export(2, false)).into_result().unwrap();
    let v3 = b.ship(export(3, false)).into_result().unwrap();
    assert_eq!(names(&manifest(&v3)), [["e"]]);
    // v3 transmitted, its outcome never came: an engine may hold it or not.
    b.transmit(v3).into_result().unwrap();
    let v4 = b.ship(export(4, false)).into_result().unwrap();
    assert_eq!(tensor_count(&v4), TENSORS.len());
}

#[test]
fn transmit_refuses_a_shipment_its_trainer_half_did_not_plan() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let buckets = |version, placed: Vec<PlacedBucket>| Shipment {
        version,
        digest: "".into(),
        body: ShipmentBody::Buckets {
            group: "bridge".into(),
            buckets: RVec::from(placed),
        },
    };
    let e = b
        .transmit(buckets(1, Vec::new()))
        .into_result()
        .unwrap_err();
    assert!(e.message.contains("last planned nothing"), "{e}");
    let v1 = b.ship(export(1, true)).into_result().unwrap();
    let mut other = v1.clone();
    other.version = 9;
    let e = b.transmit(other).into_result().unwrap_err();
    assert!(e.message.contains("asked to transmit v9"), "{e}");
    assert!(e.message.contains("last planned v1 (1 buckets)"), "{e}");

    // The planned version, but a bucket past the region's end: refused before a byte goes.
    let mut outside = placed(&v1);
    outside[0].start = 4096;
    let e = b.transmit(buckets(1, outside)).into_result().unwrap_err();
    assert!(e.message.contains("bucket 0 of the shipment"), "{e}");
    assert!(
        e.message.contains("outside region memfd:test:region"),
        "{e}"
    );

    let update = Shipment::from_update(export(1, true));
    let e = b.transmit(update).into_result().unwrap_err();
    assert!(e.message.contains("shipment of shared_region"), "{e}");
    let mut elsewhere = v1.clone();
    if let ShipmentBody::Buckets { group, .. } = &mut elsewhere.body {
        *group = "other".into();
    }
    let e = b.transmit(elsewhere).into_result().unwrap_err();
    assert!(e.message.contains("group `other`"), "{e}");
    assert!(host.take_broadcasts().is_empty());

    // None of it was the planned shipment going out: the plan still ships.
    b.transmit(v1).into_result().unwrap();
    assert_eq!(host.take_broadcasts().len(), 2);
}

#[test]
fn an_unseen_region_without_its_layout_and_wrong_kinds_are_refused() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let e = b.ship(export(1, false)).into_result().unwrap_err();
    assert!(e.message.contains("without its tensor layout"), "{e}");

    let tensor_buckets = WeightUpdate {
        version: 1,
        digest: "".into(),
        payload: UpdatePayload::TensorBuckets {
            group: "bridge".into(),
            buckets: RVec::new(),
        },
    };
    let e = b.ship(tensor_buckets).into_result().unwrap_err();
    assert!(
        e.message.contains("(trainer side): got a `tensor_buckets`"),
        "{e}"
    );
    let calls = Arc::new(Mutex::new(0));
    let region = Shipment::from_update(export(1, true));
    let e = b.receive(region, sink(&calls)).into_result().unwrap_err();
    assert!(
        e.message
            .contains("(engine side): got a shipment of shared_region"),
        "{e}"
    );
    let owned = Shipment {
        version: 1,
        digest: "".into(),
        body: ShipmentBody::Owned {
            data: RVec::from(vec![1, 2, 3]),
            wire_bytes: 3,
        },
    };
    let e = b.receive(owned, sink(&calls)).into_result().unwrap_err();
    assert!(e.message.contains("shipment of bridge_owned"), "{e}");

    let shipped = b.ship(export(1, true)).into_result().unwrap();
    let received = b.receive(shipped.clone(), sink(&calls)).into_result();
    assert_eq!(
        received.unwrap(),
        Received::Apply(shipped.to_update().unwrap()),
        "the engine half hands the engine the buckets, without their starts"
    );
    assert_eq!(*calls.lock().unwrap(), 0, "the sink is not used");
}

#[test]
fn stats_are_the_figures_since_the_last_call_and_the_engine_half_has_none() {
    let host = TestHost::with_region();
    let b = bridge(&host, "");
    let named = |metrics: RVec<Metric>| -> Vec<(String, f64)> {
        metrics
            .iter()
            .map(|m| (m.name.to_string(), m.value))
            .collect()
    };
    let engine_half = bridge(&host, "");
    assert!(engine_half.stats().into_result().unwrap().is_empty());

    let mut engine = vec![0u8; TENSORS.len() * TENSOR_BYTES];
    sync(&b, &host, &mut engine, 1);
    host.train(&[0]);
    sync(&b, &host, &mut engine, 2);
    let stats = named(b.stats().into_result().unwrap());
    let keys: Vec<&str> = stats.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        keys,
        [
            "shipped_tensors",
            "shipped_bytes",
            "total_bytes",
            "ship_s",
            "transmit_s"
        ]
    );
    assert_eq!(stats[0].1, 6.0, "5 tensors, then 1");
    assert_eq!(stats[1].1, 6144.0);
    assert_eq!(stats[2].1, 10240.0);
    assert!(stats[3].1 >= 0.0 && stats[4].1 >= 0.0, "{stats:?}");

    sync(&b, &host, &mut engine, 3);
    let stats = named(b.stats().into_result().unwrap());
    assert_eq!((stats[0].1, stats[1].1), (0.0, 0.0), "only v3's: {stats:?}");
    assert_eq!(stats[2].1, 5120.0);
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
    assert_eq!(ours.api_level, tandem_plugin_api::api_level::BRIDGE_IO);
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
