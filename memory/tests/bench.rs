//! The benchmark library function returns every case with a measured limit (no timing asserts).
#![allow(clippy::unwrap_used)]

mod common;

use tandem_memory::{BenchOptions, bench};

#[test]
fn bench_reports_each_case_beside_its_limit() {
    let _big = common::big_memory_lock();
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
fn bench_rejects_inverted_sizes() {
    let e = bench(&BenchOptions {
        min_size: 8 << 20,
        max_size: 1 << 20,
        ..BenchOptions::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("min_size"), "{e}");
}
