//! Pause/resume through the public API: physical memory really goes back to the OS (the memfd's
//! own block count is the primary evidence, system `Shmem` and process RSS the secondary), the
//! address stays, and contents come back bit-exact (backup) or zeroed (discard).
#![allow(clippy::unwrap_used)]

use crate::common;

use tandem_memory::{
    BackupPolicy, DType, ManagerConfig, MemoryError, MemoryManager, RegionSpec, Tag, process_rss,
    system_shmem_bytes,
};

const GIB: usize = 1 << 30;

#[test]
fn pausing_a_1gib_weights_region_frees_it_and_resume_restores_every_byte() {
    let _big = common::big_memory_lock();
    let mgr = MemoryManager::new(ManagerConfig::cpu("test"));
    let mut w = mgr
        .alloc(RegionSpec::new(Tag::Weights, GIB, DType::U64))
        .unwrap();
    common::fill(&mut w.view_mut::<u64>().unwrap(), 7);
    let addr = w.as_ptr();
    assert_eq!(
        w.allocated_bytes(),
        GIB as u64,
        "a filled region holds all its pages"
    );

    // System Shmem is shared with every process on the machine, so allow a few attempts for
    // unrelated shmem traffic; the memfd's own block count is checked on every attempt.
    let mut drops = Vec::new();
    for _ in 0..3 {
        let rss0 = process_rss().unwrap();
        let shm0 = system_shmem_bytes().unwrap();
        mgr.pause(&[Tag::Weights]).unwrap();
        let shm1 = system_shmem_bytes().unwrap();
        let rss1 = process_rss().unwrap();
        assert!(w.is_paused());
        assert_eq!(
            w.allocated_bytes(),
            0,
            "the memfd must hold no pages while paused"
        );
        assert!(
            rss0.shmem.saturating_sub(rss1.shmem) >= GIB as u64 * 99 / 100,
            "process shared RSS should drop by the region: {rss0:?} -> {rss1:?}"
        );
        assert!(
            rss1.total < rss0.total + (64 << 20),
            "RSS must not grow: {rss0:?} -> {rss1:?}"
        );
        drops.push(shm0 as i64 - shm1 as i64);
        mgr.resume(&[Tag::Weights]).unwrap();
        assert_eq!(w.as_ptr(), addr, "resume keeps the address");
        assert_eq!(w.allocated_bytes(), GIB as u64);
        if *drops.last().unwrap() >= (GIB as i64) * 99 / 100 {
            break;
        }
    }
    assert!(
        drops.iter().any(|&d| d >= (GIB as i64) * 99 / 100),
        "system Shmem should drop by >= 99% of 1 GiB on pause; drops seen: {drops:?}"
    );
    let v = w.view::<u64>().unwrap();
    assert_eq!(
        common::first_mismatch(&v, 7),
        None,
        "every byte must come back"
    );
}

#[test]
fn discard_regions_free_their_rss_and_come_back_zeroed() {
    let _big = common::big_memory_lock();
    let size = 256 << 20;
    let mgr = MemoryManager::new(ManagerConfig::cpu("test"));
    let spec = RegionSpec::new(Tag::KvCache, size, DType::BF16).with_backup(BackupPolicy::Discard);
    let mut kv = mgr.alloc(spec).unwrap();
    kv.view_mut::<u16>().unwrap().fill(0xBEEF);
    let addr = kv.as_ptr();
    let rss0 = process_rss().unwrap();
    mgr.pause(&[Tag::KvCache]).unwrap();
    let rss1 = process_rss().unwrap();
    assert_eq!(kv.allocated_bytes(), 0);
    assert!(
        rss0.total.saturating_sub(rss1.total) >= size as u64 * 9 / 10,
        "a discard pause keeps no copy, so total RSS drops: {rss0:?} -> {rss1:?}"
    );
    let report = mgr.report();
    assert_eq!(report.totals().backup_bytes, 0);
    mgr.resume(&[Tag::KvCache]).unwrap();
    assert_eq!(kv.as_ptr(), addr);
    assert_eq!(
        kv.allocated_bytes(),
        size as u64,
        "resume allocates the pages up front"
    );
    assert!(
        kv.view::<u16>().unwrap().iter().all(|&x| x == 0),
        "discard comes back zeroed"
    );
}

#[test]
fn pause_and_resume_select_by_tag_and_reject_wrong_states() {
    let mgr = MemoryManager::new(ManagerConfig::cpu("test"));
    let mut w = mgr
        .alloc(RegionSpec::new(Tag::Weights, 1 << 20, DType::F32))
        .unwrap();
    let mut g = mgr
        .alloc(RegionSpec::new(Tag::Grads, 1 << 20, DType::F32))
        .unwrap();
    w.view_mut::<f32>().unwrap().fill(1.5);
    g.view_mut::<f32>().unwrap().fill(2.5);

    let moved = mgr.pause(&[Tag::Weights]).unwrap();
    assert_eq!((moved.regions, moved.bytes), (1, 1 << 20));
    assert!(w.is_paused() && !g.is_paused());
    assert_eq!(mgr.resident_bytes(), 1 << 20);

    let e = mgr.pause(&[Tag::Weights]).unwrap_err();
    assert!(matches!(e, MemoryError::AlreadyPaused { .. }), "{e}");
    assert!(e.to_string().contains("already paused"), "{e}");
    let e = mgr.resume(&[Tag::Grads]).unwrap_err();
    assert!(matches!(e, MemoryError::NotPaused { .. }), "{e}");
    // all-or-nothing: one resident region among the selection means nothing is resumed
    let e = mgr.resume(&[Tag::Weights, Tag::Grads]).unwrap_err();
    assert!(matches!(e, MemoryError::NotPaused { .. }), "{e}");
    assert!(w.is_paused());

    let e = w.view::<f32>().unwrap_err();
    assert!(matches!(e, MemoryError::Paused { .. }), "{e}");

    mgr.resume(&[Tag::Weights]).unwrap();
    assert!(w.view::<f32>().unwrap().iter().all(|&x| x == 1.5));
    assert!(g.view::<f32>().unwrap().iter().all(|&x| x == 2.5));
    // a tag with no regions selects nothing
    assert_eq!(mgr.pause(&[Tag::Drafter]).unwrap().regions, 0);
}

#[test]
fn a_live_view_blocks_moving_the_region() {
    let mgr = MemoryManager::new(ManagerConfig::cpu("test"));
    let w = mgr
        .alloc(RegionSpec::new(Tag::Weights, 4096, DType::U8))
        .unwrap();
    let view = w.view::<u8>().unwrap();
    let e = mgr.pause(&[Tag::Weights]).unwrap_err();
    assert!(matches!(e, MemoryError::Borrowed { .. }), "{e}");
    drop(view);
    mgr.pause(&[Tag::Weights]).unwrap();
}

#[test]
fn typed_views_check_the_element_size() {
    let mgr = MemoryManager::new(ManagerConfig::cpu("test"));
    let w = mgr
        .alloc(RegionSpec::new(Tag::Weights, 64, DType::BF16))
        .unwrap();
    assert_eq!(w.view::<u16>().unwrap().len(), 32);
    assert_eq!(w.view::<u8>().unwrap().len(), 64);
    let e = w.view::<f32>().unwrap_err().to_string();
    assert!(e.contains("cannot be viewed as a 4-byte type"), "{e}");
}

#[test]
fn dropping_a_region_returns_its_budget() {
    let mgr = MemoryManager::new(ManagerConfig::cpu("test"));
    let w = mgr
        .alloc(RegionSpec::new(Tag::Weights, 8192, DType::U8))
        .unwrap();
    assert_eq!(mgr.resident_bytes(), 8192);
    drop(w);
    assert_eq!(mgr.resident_bytes(), 0);
    assert!(mgr.report().regions.is_empty());
}
