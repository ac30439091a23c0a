//! `tandem bench transport`: point-to-point and broadcast bandwidth over shm and tcp (loopback)
//! between real processes, beside a memcpy of the same size timed in the same trial, and
//! small-message round-trip latency beside a cross-core atomic ping-pong.
//!
//! Targets (issue 4): shm p2p >= 0.7x memcpy for messages >= 1 MiB; shm round trip <= 20 µs.
//! The bench children are this same executable (`tandem-bench`), re-run with [`CHILD_ENV`]
//! set; its `main` hands them to [`child_main_if_requested`] first thing. [`world`] spawns and
//! reads them, [`child`] is what they run.

mod child;
pub mod world;

pub use child::child_main_if_requested;
pub use world::{BenchOptions, CHILD_ENV, Measurement, bench};

use super::Figure;
use tandem_cli::error::CliError;

/// Largest message of `--quick` runs.
pub const QUICK_MAX_BYTES: usize = 16 << 20;

/// Runs the benchmark: up to 16 MiB messages with `quick`, else up to 1 GiB.
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let mut opts = BenchOptions::default();
    if quick {
        opts.max_bytes = QUICK_MAX_BYTES;
        opts.latency_iters = 500;
    }
    let measured =
        bench(&opts).map_err(|e| CliError::failed(format!("tandem bench transport: {e}")))?;
    Ok(measured.iter().map(figure).collect())
}

fn figure(m: &Measurement) -> Figure {
    let latency = m.unit == "us";
    let f = Figure::new("transport", &m.case, m.value, m.unit, m.limit).limit_name(if latency {
        "atomic ping-pong"
    } else {
        "memcpy"
    });
    let shm = m.case.contains("shm");
    if shm && latency {
        f.target("value <= 20 us")
    } else if shm && m.case.starts_with("p2p") && message_bytes(&m.case) >= Some(1 << 20) {
        f.target(">= 0.7")
    } else {
        f
    }
}

/// Message size parsed from a case name such as `p2p shm 4 MiB`.
fn message_bytes(case: &str) -> Option<usize> {
    let words: Vec<&str> = case.split_whitespace().collect();
    let [.., n, unit] = words.as_slice() else {
        return None;
    };
    let n: usize = n.parse().ok()?;
    let unit = match *unit {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    Some(n * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_size_is_parsed_from_the_case() {
        assert_eq!(message_bytes("p2p shm 4 MiB"), Some(4 << 20));
        assert_eq!(message_bytes("broadcast tcp x4 1 GiB"), Some(1 << 30));
        assert_eq!(message_bytes("latency shm round trip 8 B"), Some(8));
        assert_eq!(message_bytes("p2p shm"), None);
    }
}
