//! The memory and transport benches as library functions return every case with a measured
//! limit (no timing asserts). The transport bench's rank processes are the built
//! `tandem-bench` binary.
#![allow(clippy::unwrap_used)]

use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use tandem_bench::memory::{BenchOptions, bench};

/// tandem-memory's tests' cross-process lock for tests that measure system-wide memory (the
/// same file as its `tests/common::big_memory_lock`): the Shmem figures below would see theirs.
fn big_memory_lock() -> Flock<File> {
    let path = std::env::temp_dir().join("tandem-memory-big-tests.lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap();
    Flock::lock(f, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap()
}

#[test]
fn memory_bench_reports_each_case_beside_its_limit() {
    let _big = big_memory_lock();
    let opts = BenchOptions {
        min_size: 1 << 20,
        max_size: 4 << 20,
        ..BenchOptions::default()
    };
    let ms = bench(&opts).unwrap();
    for size in ["1MiB", "4MiB"] {
        for case in [
            "pause_backup_cold",
            "pause_backup",
            "resume_backup",
            "pause_discard",
            "resume_discard",
            "kernel_punch_hole",
            "kernel_page_alloc",
            "kernel_shmem_pwrite",
        ] {
            let name = format!("{case}/{size}");
            let m = ms
                .iter()
                .find(|m| m.case == name)
                .unwrap_or_else(|| panic!("missing {name}: {ms:?}"));
            assert_eq!((m.unit, m.limit_name.as_str()), ("GB/s", "memcpy"));
            assert_eq!(m.size, if size == "1MiB" { 1 << 20 } else { 4 << 20 });
            assert!(m.value.is_finite() && m.value > 0.0, "{m:?}");
            assert!(m.limit.is_finite() && m.limit > 0.0, "{m:?}");
        }
    }
    for size in [1usize << 20, 4 << 20] {
        let m = ms
            .iter()
            .find(|m| m.case.starts_with("shmem_huge_mapped/") && m.size == size)
            .unwrap();
        assert!(m.value <= size as f64, "{m:?}");
        assert!(m.limit_name.contains("shmem_enabled="), "{m:?}");
    }
    // footprint figures for the largest size; a 4 MiB pause leaves Shmem lower or within noise
    for case in [
        "rss_before_pause",
        "rss_after_pause",
        "shmem_before_pause",
        "shmem_after_pause",
    ] {
        let m = ms
            .iter()
            .find(|m| m.case == format!("{case}/4MiB"))
            .unwrap();
        assert_eq!((m.unit, m.limit), ("bytes", (4 << 20) as f64));
        assert!(m.value > 0.0 || case.starts_with("shmem"), "{m:?}");
    }
}

#[test]
fn memory_bench_rejects_inverted_sizes() {
    let e = bench(&BenchOptions {
        min_size: 8 << 20,
        max_size: 1 << 20,
        ..BenchOptions::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("min_size"), "{e}");
}

#[test]
fn transport_bench_reports_every_case_beside_a_limit() {
    let opts = tandem_bench::transport::BenchOptions {
        min_bytes: 4096,
        max_bytes: 65536,
        broadcast_ranks: 3,
        latency_iters: 50,
        child_program: Some(env!("CARGO_BIN_EXE_tandem-bench").into()),
        ..Default::default()
    };
    let ms = tandem_bench::transport::bench(&opts).unwrap();
    let cases: Vec<&str> = ms.iter().map(|m| m.case.as_str()).collect();
    for want in [
        "latency shm round trip 8 B",
        "p2p shm 4 KiB",
        "p2p shm 64 KiB",
        "broadcast shm x3 16 KiB",
        "latency tcp round trip 8 B",
        "p2p tcp 16 KiB",
        "broadcast tcp x3 64 KiB",
    ] {
        assert!(cases.contains(&want), "missing {want} in {cases:?}");
    }
    assert!(cases.contains(&"shm single-copy kernel copy 8 MiB"));
    assert_eq!(ms.len(), 2 * (1 + 3 + 3) + 1);
    for m in &ms {
        assert!(m.value.is_finite() && m.value > 0.0, "{m:?}");
        assert!(m.limit.is_finite() && m.limit > 0.0, "{m:?}");
    }
}
