//! keep_resident guards, snapshots and budgets through the public API.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use tandem_memory::{Budget, DType, ManagerConfig, MemoryError, MemoryManager, RegionSpec, Tag};

fn mgr() -> MemoryManager {
    MemoryManager::new(ManagerConfig::cpu("test"))
}

#[test]
fn keep_resident_makes_pause_fail_until_the_guard_drops() {
    let m = mgr();
    let _w = m
        .alloc(RegionSpec::new(Tag::Weights, 4096, DType::U8))
        .unwrap();
    let _k = m
        .alloc(RegionSpec::new(Tag::KvCache, 4096, DType::U8))
        .unwrap();
    let guard = m.keep_resident(&[Tag::Weights]);
    let e = m.pause(&[Tag::KvCache, Tag::Weights]).unwrap_err();
    assert!(
        matches!(e, MemoryError::KeptResident { guards: 1, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("keep_resident"), "{e}");
    // other tags are unaffected
    m.pause(&[Tag::KvCache]).unwrap();
    let e = m
        .pause_wait(&[Tag::Weights], Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(e, MemoryError::GuardTimeout { .. }), "{e}");
    drop(guard);
    m.pause(&[Tag::Weights]).unwrap();
}

#[test]
fn pause_wait_proceeds_when_the_guard_is_dropped_on_another_thread() {
    let m = mgr();
    let w = m
        .alloc(RegionSpec::new(Tag::Weights, 4096, DType::U8))
        .unwrap();
    let guard = m.keep_resident(&[Tag::Weights]);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(guard);
    });
    let moved = m
        .pause_wait(&[Tag::Weights], Duration::from_secs(30))
        .unwrap();
    assert_eq!(moved.regions, 1);
    assert!(w.is_paused());
    t.join().unwrap();
}

#[test]
fn snapshots_round_trip_and_switch_between_names() {
    let m = mgr();
    let mut w = m
        .alloc(RegionSpec::new(Tag::Weights, 1 << 20, DType::U64))
        .unwrap();
    let mut d = m
        .alloc(RegionSpec::new(Tag::Drafter, 8192, DType::U64))
        .unwrap();
    common::fill(&mut w.view_mut::<u64>().unwrap(), 1);
    common::fill(&mut d.view_mut::<u64>().unwrap(), 10);
    let info = m.snapshot("actor", &[Tag::Weights, Tag::Drafter]).unwrap();
    assert_eq!((info.regions, info.bytes), (2, (1 << 20) + 8192));
    common::fill(&mut w.view_mut::<u64>().unwrap(), 2);
    m.snapshot("ref", &[Tag::Weights]).unwrap();
    common::fill(&mut w.view_mut::<u64>().unwrap(), 3);
    common::fill(&mut d.view_mut::<u64>().unwrap(), 30);

    m.restore("ref").unwrap();
    assert_eq!(common::first_mismatch(&w.view::<u64>().unwrap(), 2), None);
    assert_eq!(
        common::first_mismatch(&d.view::<u64>().unwrap(), 30),
        None,
        "ref has no drafter"
    );
    m.restore("actor").unwrap();
    assert_eq!(common::first_mismatch(&w.view::<u64>().unwrap(), 1), None);
    assert_eq!(common::first_mismatch(&d.view::<u64>().unwrap(), 10), None);

    // re-taking a name replaces it
    common::fill(&mut w.view_mut::<u64>().unwrap(), 4);
    m.snapshot("actor", &[Tag::Weights]).unwrap();
    common::fill(&mut w.view_mut::<u64>().unwrap(), 5);
    m.restore("actor").unwrap();
    assert_eq!(common::first_mismatch(&w.view::<u64>().unwrap(), 4), None);

    let names: Vec<String> = m.list_snapshots().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["actor", "ref"]);
    assert_eq!(m.report().snapshot_bytes, 2 << 20);
    m.drop_snapshot("ref").unwrap();
    assert_eq!(m.list_snapshots().len(), 1);
}

#[test]
fn unknown_stale_and_paused_snapshots_are_clear_errors() {
    let m = mgr();
    let w = m
        .alloc(RegionSpec::new(Tag::Weights, 4096, DType::U8))
        .unwrap();
    let e = m.restore("nope").unwrap_err();
    assert!(matches!(e, MemoryError::UnknownSnapshot { .. }), "{e}");
    assert!(m.drop_snapshot("nope").is_err());
    let e = m.snapshot("x", &[Tag::Optimizer]).unwrap_err().to_string();
    assert!(e.contains("no region has tag(s) [optimizer]"), "{e}");

    m.snapshot("actor", &[Tag::Weights]).unwrap();
    let e = m.restore("nope").unwrap_err().to_string();
    assert!(
        e.contains("unknown snapshot `nope`; existing snapshots: [actor]"),
        "{e}"
    );
    m.pause(&[Tag::Weights]).unwrap();
    let e = m.restore("actor").unwrap_err();
    assert!(matches!(e, MemoryError::Paused { .. }), "{e}");
    let e = m.snapshot("again", &[Tag::Weights]).unwrap_err();
    assert!(matches!(e, MemoryError::Paused { .. }), "{e}");
    m.resume(&[Tag::Weights]).unwrap();
    drop(w);
    let e = m.restore("actor").unwrap_err();
    assert!(matches!(e, MemoryError::StaleSnapshot { .. }), "{e}");
}

#[test]
fn allocation_over_the_budget_names_tag_request_and_remaining() {
    let m = MemoryManager::new(ManagerConfig::cpu("trainer-0").with_budget(Budget::bytes(1 << 20)));
    let _a = m
        .alloc(RegionSpec::new(Tag::Weights, 768 << 10, DType::U8))
        .unwrap();
    let e = m
        .alloc(RegionSpec::new(Tag::Optimizer, 512 << 10, DType::U8))
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, MemoryError::OverBudget { .. }));
    for needle in [
        "`optimizer`",
        "524288 bytes",
        "262144 of 1048576 bytes remain",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in: {text}");
    }
    assert_eq!(m.remaining_budget(), Some(256 << 10));
}

#[test]
fn resume_is_also_held_to_the_budget() {
    let m = MemoryManager::new(ManagerConfig::cpu("engine-0").with_budget(Budget::bytes(1 << 20)));
    let _w = m
        .alloc(RegionSpec::new(Tag::Weights, 1 << 20, DType::U8))
        .unwrap();
    m.pause(&[Tag::Weights]).unwrap();
    let _k = m
        .alloc(RegionSpec::new(Tag::KvCache, 512 << 10, DType::U8))
        .unwrap();
    let e = m.resume(&[Tag::Weights]).unwrap_err().to_string();
    assert!(
        e.contains("`weights`") && e.contains("524288 of 1048576 bytes remain"),
        "{e}"
    );
}

#[test]
fn manager_and_regions_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let m = mgr();
    let r = m
        .alloc(RegionSpec::new(Tag::Activations, 4096, DType::F32))
        .unwrap();
    send_sync(&m);
    send_sync(&r);
    let m2 = m.clone();
    let id = std::thread::spawn(move || m2.pause(&[Tag::Activations]).unwrap().regions)
        .join()
        .unwrap();
    assert_eq!(id, 1);
    assert!(r.is_paused());
}
