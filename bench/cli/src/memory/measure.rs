//! The memory bench's measurements: pause and resume throughput of the CPU backend, with and
//! without backup, each beside plain memcpy bandwidth measured in the same run for the same
//! size, plus RSS and system `Shmem` before and after a pause of the largest region.
//!
//! How the limit is measured: after one pause/resume cycle the region's backup buffer is warm, so
//! the bench copies the resident region into it directly (one thread; best of six, interleaved
//! with three warm pause/resume rounds whose best is reported) - a plain memcpy between two
//! faulted-in buffers of the region's size, with no extra memory
//! ([`tandem_memory::bench::memcpy_limit`]).
//!
//! Kernel ceilings, measured on the same region right after, each in one thread
//! ([`tandem_memory::bench::kernel_rates`]): `kernel_punch_hole` (returning its pages: what every
//! pause pays on top of the copy), `kernel_page_alloc` (faulting zeroed pages in through the
//! mapping with `MADV_POPULATE_WRITE`: what a discard resume, and a backup resume with shmem huge
//! pages, pays before copying) and `kernel_shmem_pwrite` (`pwrite` into a hole: page allocation
//! without zeroing, what a backup resume pays with 4 KiB shmem pages). `shmem_huge_mapped` says
//! how much of the region the kernel mapped with 2 MiB pages (its limit name carries the
//! `shmem_enabled` setting).

use std::time::Instant;

use tandem_memory::bench::{
    kernel_rates, memcpy_limit, shmem_huge_mapped_bytes, shmem_thp_setting,
};
use tandem_memory::{
    BackupPolicy, DType, ManagerConfig, MemoryError, MemoryManager, Region, RegionSpec, Result,
    Tag, mem_available_bytes, process_rss_bytes, system_shmem_bytes,
};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Smallest region size in bytes (default 1 MiB).
    pub min_size: usize,
    /// Largest region size in bytes (default 4 GiB). Sizes go up by 4x from `min_size`; a size
    /// that does not fit twice into `MemAvailable` is skipped and reported as `skipped/<size>`.
    pub max_size: usize,
    /// Threads a pause or resume may use ([`ManagerConfig::move_threads`]).
    pub move_threads: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            min_size: 1 << 20,
            max_size: 4 << 30,
            move_threads: ManagerConfig::cpu("bench").move_threads,
        }
    }
}

/// One figure beside its physical limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// What was measured, e.g. `pause_backup/64MiB`.
    pub case: String,
    /// Region size the case ran at, in bytes.
    pub size: usize,
    /// The figure.
    pub value: f64,
    /// Its unit (`GB/s`, `bytes`).
    pub unit: &'static str,
    /// The limit: memcpy GB/s at the same size for throughputs; the region size for byte counts.
    pub limit: f64,
    /// What the limit is (`memcpy`, `region size`, ...).
    pub limit_name: String,
}

/// Runs the memory benchmark.
pub fn bench(opts: &BenchOptions) -> Result<Vec<Measurement>> {
    if opts.min_size == 0 || opts.min_size > opts.max_size {
        return Err(MemoryError::InvalidArgument(format!(
            "bench sizes must satisfy 0 < min_size ({}) <= max_size ({})",
            opts.min_size, opts.max_size
        )));
    }
    let mut sizes = vec![opts.min_size];
    while let Some(next) = sizes.last().and_then(|s| s.checked_mul(4))
        && next <= opts.max_size
    {
        sizes.push(next);
    }
    let largest = sizes.iter().copied().rfind(|&s| fits(s));
    let mut out = Vec::new();
    for size in sizes {
        if !fits(size) {
            out.push(Measurement {
                case: format!("skipped/{}", label(size)),
                size,
                value: (2 * size) as f64,
                unit: "bytes",
                limit: mem_available_bytes()? as f64,
                limit_name: "MemAvailable".into(),
            });
            continue;
        }
        bench_size(size, Some(size) == largest, opts.move_threads, &mut out)?;
    }
    Ok(out)
}

fn fits(size: usize) -> bool {
    mem_available_bytes().is_ok_and(|a| (2 * size as u64).saturating_add(256 << 20) < a)
}

fn label(size: usize) -> String {
    if size >= 1 << 30 && size.is_multiple_of(1 << 30) {
        format!("{}GiB", size >> 30)
    } else if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{}MiB", size >> 20)
    } else {
        format!("{size}B")
    }
}

fn gbs(size: usize, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(size as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9)
}

fn bench_size(
    size: usize,
    footprint: bool,
    threads: usize,
    out: &mut Vec<Measurement>,
) -> Result<()> {
    let mgr = MemoryManager::new(ManagerConfig::cpu("bench").with_move_threads(threads));
    let tag = Tag::Custom("bench".into());
    let tags = std::slice::from_ref(&tag);
    let l = label(size);

    let mut region = mgr.alloc(RegionSpec::new(tag.clone(), size, DType::U8))?;
    fill(&mut region)?;
    let before = if footprint {
        Some((process_rss_bytes()?, system_shmem_bytes()?))
    } else {
        None
    };
    let pause_cold = gbs(size, || mgr.pause(tags).map(drop))?;
    let after = if footprint {
        Some((process_rss_bytes()?, system_shmem_bytes()?))
    } else {
        None
    };
    let mut resume = gbs(size, || mgr.resume(tags).map(drop))?;
    // Limit and figures interleaved, best of 3 each, so a burst of load on this shared machine
    // hits both alike.
    let (mut memcpy, mut pause_warm) = (0f64, 0f64);
    for _ in 0..3 {
        memcpy = memcpy.max(memcpy_limit(&region)?);
        pause_warm = pause_warm.max(gbs(size, || mgr.pause(tags).map(drop))?);
        resume = resume.max(gbs(size, || mgr.resume(tags).map(drop))?);
    }
    check(&region)?;
    let huge = shmem_huge_mapped_bytes(&region)?;
    let kernel = kernel_rates(&region)?;
    drop(region);

    let mut discard = mgr
        .alloc(RegionSpec::new(tag.clone(), size, DType::U8).with_backup(BackupPolicy::Discard))?;
    fill(&mut discard)?;
    let pause_discard = gbs(size, || mgr.pause(tags).map(drop))?;
    let resume_discard = gbs(size, || mgr.resume(tags).map(drop))?;
    drop(discard);

    let mut push = |case: &str, value: f64| {
        out.push(Measurement {
            case: format!("{case}/{l}"),
            size,
            value,
            unit: "GB/s",
            limit: memcpy,
            limit_name: "memcpy".into(),
        })
    };
    push("pause_backup_cold", pause_cold);
    push("pause_backup", pause_warm);
    push("resume_backup", resume);
    push("pause_discard", pause_discard);
    push("resume_discard", resume_discard);
    push("kernel_punch_hole", kernel.punch);
    push("kernel_page_alloc", kernel.alloc);
    push("kernel_shmem_pwrite", kernel.pwrite);
    let mut bytes = |case: &str, value: u64, limit_name: String| {
        out.push(Measurement {
            case: format!("{case}/{l}"),
            size,
            value: value as f64,
            unit: "bytes",
            limit: size as f64,
            limit_name,
        })
    };
    let thp = format!("region size; shmem_enabled={}", shmem_thp_setting());
    bytes("shmem_huge_mapped", huge, thp);
    if let (Some((rss0, shm0)), Some((rss1, shm1))) = (before, after) {
        for (case, v) in [
            ("rss_before_pause", rss0),
            ("rss_after_pause", rss1),
            ("shmem_before_pause", shm0),
            ("shmem_after_pause", shm1),
        ] {
            bytes(case, v, "region size".into());
        }
    }
    Ok(())
}

fn fill(region: &mut Region) -> Result<()> {
    let mut v = region.view_mut::<u8>()?;
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        let word = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    Ok(())
}

fn check(region: &Region) -> Result<()> {
    let v = region.view::<u8>()?;
    for (i, chunk) in v.chunks(8).enumerate().step_by(4099) {
        let word = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
        if chunk != &word[..chunk.len()] {
            return Err(MemoryError::InvalidArgument(format!(
                "bench: region {} lost data after pause/resume at word {i}",
                region.id()
            )));
        }
    }
    Ok(())
}
