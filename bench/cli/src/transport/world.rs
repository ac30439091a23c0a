//! The transport bench's world of rank processes: [`bench()`] spawns real rank processes (by
//! default the current executable again) and returns each figure beside its physical limit
//! measured in the same run: p2p and broadcast bandwidth beside memcpy bandwidth of the same
//! size, and small-message round trip beside a cross-core atomic ping-pong.
//!
//! **Child entry point.** The children are the current executable re-run with
//! [`CHILD_ENV`] set; the binary must call
//! [`child_main_if_requested`](super::child_main_if_requested) first thing in `main` (before
//! parsing arguments):
//!
//! ```no_run
//! // First statement of the binary's `main`:
//! tandem_bench::transport::child_main_if_requested(); // never returns in a bench child
//! // ... normal CLI ...
//! ```

use std::path::PathBuf;
use std::time::Duration;
use tandem_transport::local::{self, LocalSpec};
use tandem_transport::store::StoreClient;
use tandem_transport::{BackendKind, CommConfig, Result, TransportError, TransportOverride};
/// Set (to the role) in bench children.
pub const CHILD_ENV: &str = "TANDEM_TRANSPORT_BENCH_CHILD";
/// Carries the size list to children.
pub(super) const SIZES_ENV: &str = "TANDEM_TRANSPORT_BENCH_SIZES";
/// Carries the latency iteration count to children.
pub(super) const ITERS_ENV: &str = "TANDEM_TRANSPORT_BENCH_ITERS";
/// Store key where rank 0 publishes its measurements.
pub(super) const RESULTS_KEY: &str = "bench/results";

/// One figure beside its limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// What was measured, e.g. `"p2p shm 1 MiB"`.
    pub case: String,
    /// The figure.
    pub value: f64,
    /// Unit of `value` and `limit` (`"GB/s"` or `"us"`).
    pub unit: &'static str,
    /// The physical limit measured in the same run, in `unit` (memcpy bandwidth of the same
    /// size; for latency the cross-core atomic round trip).
    pub limit: f64,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Smallest message (default 4 KiB).
    pub min_bytes: usize,
    /// Largest message (default 1 GiB); sizes go up by 4x.
    pub max_bytes: usize,
    /// Backends to measure (default shm and tcp over loopback).
    pub backends: Vec<BackendKind>,
    /// Ranks in the broadcast world (default 4); below 2 skips broadcast.
    pub broadcast_ranks: usize,
    /// Measure the two-rank p2p figures (default true).
    pub p2p: bool,
    /// Round trips for the latency figure (default 2000).
    pub latency_iters: usize,
    /// Program to spawn as ranks (default: the current executable).
    pub child_program: Option<PathBuf>,
    /// Arguments for the children (default none; tests pass harness filters).
    pub child_args: Vec<String>,
    /// Transport timeout inside the children.
    pub timeout: Duration,
    /// Shared-memory tuning of the children.
    pub shm: tandem_transport::ShmOptions,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            min_bytes: 4 << 10,
            max_bytes: 1 << 30,
            backends: vec![BackendKind::Shm, BackendKind::Tcp],
            broadcast_ranks: 4,
            p2p: true,
            latency_iters: 2000,
            child_program: None,
            child_args: Vec::new(),
            timeout: Duration::from_secs(60),
            shm: Default::default(),
        }
    }
}

/// Message sizes: `min`, `4 min`, ... up to `max` (inclusive).
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        s = s.saturating_mul(4);
    }
    if v.last() != Some(&max) && max >= min {
        v.push(max);
    }
    v
}

/// Human size: `4 KiB`, `1 MiB`, `1 GiB`, else bytes.
pub fn human(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Runs the benchmark. Takes a few tens of seconds with the defaults.
pub fn bench(opts: &BenchOptions) -> Result<Vec<Measurement>> {
    let sizes = sizes(opts.min_bytes, opts.max_bytes);
    if sizes.is_empty() {
        return Err(TransportError::Invalid(format!(
            "bench sizes are empty: min_bytes {} > max_bytes {}",
            opts.min_bytes, opts.max_bytes
        )));
    }
    let mut out = Vec::new();
    for &b in &opts.backends {
        if b == BackendKind::Nccl {
            return Err(TransportError::Unsupported(
                "the transport bench measures shm and tcp; NCCL is not benchmarked here".into(),
            ));
        }
        if b == BackendKind::Shm {
            // What `SingleCopy::Auto` decides on: the kernel copy beside memcpy.
            let (kernel, user) = tandem_transport::single_copy_calibration();
            out.push(Measurement {
                case: "shm single-copy kernel copy 8 MiB".into(),
                value: kernel,
                unit: "GB/s",
                limit: user,
            });
        }
        if opts.p2p {
            out.extend(run_world(opts, b, 2, "p2p", &sizes)?);
        }
        if opts.broadcast_ranks >= 2 {
            out.extend(run_world(opts, b, opts.broadcast_ranks, "bcast", &sizes)?);
        }
    }
    Ok(out)
}

fn run_world(
    opts: &BenchOptions,
    backend: BackendKind,
    n: usize,
    role: &str,
    sizes: &[usize],
) -> Result<Vec<Measurement>> {
    let program = match &opts.child_program {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|source| TransportError::Io {
            context: "finding the current executable".into(),
            source,
        })?,
    };
    let token = format!("bench-{}-{}", std::process::id(), role);
    let configs = (0..n)
        .map(|r| {
            let mut c = CommConfig::new("", "", r, n);
            c.name = format!("bench-{role}-{backend}");
            c.transport = TransportOverride::Force(backend);
            c.timeout = opts.timeout;
            c.shm = opts.shm;
            c
        })
        .collect();
    let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
    let spec = LocalSpec {
        program,
        args: opts.child_args.clone(),
        env: vec![
            (CHILD_ENV.into(), role.into()),
            (SIZES_ENV.into(), list.join(",")),
            (ITERS_ENV.into(), opts.latency_iters.to_string()),
        ],
        configs,
    };
    let world = local::spawn(&spec, &token)?;
    let store = StoreClient::connect(&world.store.addr().to_string(), &token, opts.timeout)?;
    let budget = opts.timeout * 10;
    let waited = store.wait(&[RESULTS_KEY], budget);
    let raw = store.try_get(RESULTS_KEY)?;
    let codes = world.wait(Duration::from_secs(30));
    if let Err(e) = waited {
        return Err(TransportError::Invalid(format!(
            "bench {role} on {backend}: no results ({e}); child exit codes {codes:?}"
        )));
    }
    let text = String::from_utf8_lossy(&raw.unwrap_or_default()).into_owned();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if let [case, value, unit, limit] = f[..] {
            out.push(Measurement {
                case: case.into(),
                value: value.parse().unwrap_or(f64::NAN),
                unit: if unit == "us" { "us" } else { "GB/s" },
                limit: limit.parse().unwrap_or(f64::NAN),
            });
        }
    }
    if let Some(err) = text.strip_prefix("error\t") {
        return Err(TransportError::Invalid(format!(
            "bench {role} on {backend}: {err}"
        )));
    }
    Ok(out)
}
