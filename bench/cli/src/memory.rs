//! `tandem bench memory`: pause/resume throughput of the memory layer's CPU backend, with and
//! without backup, beside memcpy bandwidth and the kernel's own rates (hole punching, shmem page
//! allocation) measured in the same run; RSS and system `Shmem` around a pause.
//!
//! Target (issue 3): pause-with-backup and resume at >= 0.8x memcpy for regions >= 64 MiB.

pub mod measure;

pub use measure::{BenchOptions, Measurement, bench};

use super::Figure;
use tandem_cli::error::CliError;

/// Regions from this size up carry the 0.8x-memcpy target.
pub const TARGET_MIN_BYTES: usize = 64 << 20;

/// Largest region of `--quick` runs.
pub const QUICK_MAX_BYTES: usize = 256 << 20;

/// Largest region of full runs (sizes that do not fit in `MemAvailable` are reported skipped).
pub const FULL_MAX_BYTES: usize = 4 << 30;

/// Runs the benchmark: up to 256 MiB regions with `quick`, else up to 4 GiB.
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let opts = BenchOptions {
        max_size: if quick {
            QUICK_MAX_BYTES
        } else {
            FULL_MAX_BYTES
        },
        ..BenchOptions::default()
    };
    let measured =
        bench(&opts).map_err(|e| CliError::failed(format!("tandem bench memory: {e}")))?;
    Ok(measured.iter().map(figure).collect())
}

/// One memory-layer measurement as a bench figure, with the target where issue 3 sets one.
pub fn figure(m: &Measurement) -> Figure {
    let f = Figure::new("memory", &m.case, m.value, m.unit, m.limit).limit_name(&m.limit_name);
    if has_target(m) { f.target(">= 0.8") } else { f }
}

fn has_target(m: &Measurement) -> bool {
    let kind = m.case.split('/').next().unwrap_or("");
    matches!(kind, "pause_backup" | "resume_backup") && m.size >= TARGET_MIN_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(case: &str, size: usize) -> Measurement {
        Measurement {
            case: case.into(),
            size,
            value: 2.0,
            unit: "GB/s",
            limit: 8.0,
            limit_name: "memcpy".into(),
        }
    }

    #[test]
    fn targets_only_large_backup_pause_and_resume() {
        let f = figure(&m("pause_backup/64MiB", 64 << 20));
        assert_eq!(
            (f.target.as_str(), f.limit_name.as_str()),
            (">= 0.8", "memcpy")
        );
        assert!((f.ratio - 0.25).abs() < 1e-12);
        assert_eq!(figure(&m("resume_backup/1GiB", 1 << 30)).target, ">= 0.8");
        assert_eq!(figure(&m("resume_backup/16MiB", 16 << 20)).target, "");
        assert_eq!(figure(&m("pause_backup_cold/64MiB", 64 << 20)).target, "");
        assert_eq!(figure(&m("pause_discard/64MiB", 64 << 20)).target, "");
    }
}
