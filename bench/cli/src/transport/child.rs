//! What bench children run: join the world, measure, and (rank 0) publish the figures in the
//! store as `case\tvalue\tunit\tlimit` lines.

use super::world::{CHILD_ENV, ITERS_ENV, RESULTS_KEY, SIZES_ENV, human};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tandem_transport::{CommConfig, Communicator, Result, TransportError};

/// If this process is a bench child (env [`CHILD_ENV`] set), runs its role
/// and exits the process; otherwise returns immediately.
pub fn child_main_if_requested() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    tandem_transport::local::die_with_parent();
    let code = match run(&role) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tandem transport bench child ({role}): {e}");
            1
        }
    };
    std::process::exit(code);
}

fn run(role: &str) -> Result<()> {
    let cfg = CommConfig::from_env()?;
    let sizes: Vec<usize> = std::env::var(SIZES_ENV)
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let iters: usize = std::env::var(ITERS_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let w = Communicator::init(&cfg)?;
    let backend = cfg.transport.to_string();
    let result = match role {
        "p2p" => p2p(&w, &backend, &sizes, iters),
        "bcast" => bcast(&w, &backend, &sizes),
        other => Err(TransportError::Invalid(format!(
            "unknown bench role {other}"
        ))),
    };
    if w.rank() == 0 {
        let text = match &result {
            Ok(lines) => lines.join("\n"),
            Err(e) => format!("error\t{e}"),
        };
        w.store().set(RESULTS_KEY, text.as_bytes())?;
    }
    result.map(|_| ())
}

fn line(case: String, value: f64, unit: &str, limit: f64) -> String {
    format!("{case}\t{value}\t{unit}\t{limit}")
}

/// A GB/s figure: `bytes` moved in `secs`, beside the memcpy limit (the same bytes copied in
/// `copy_secs`).
fn throughput(case: String, bytes: usize, secs: f64, copy_secs: f64) -> String {
    let gb = bytes as f64 / 1e9;
    line(case, gb / secs, "GB/s", gb / copy_secs)
}

/// Repetitions for a size: about 256 MiB of traffic, at least 3, at most 2000.
fn reps(size: usize) -> usize {
    ((256usize << 20) / size.max(1)).clamp(3, 2000)
}

/// Timed trials per figure; the best counts (the machine is shared, so the best trial is the
/// least disturbed one, for the figure and its limit alike).
const TRIALS: usize = 3;

/// Seconds for `n` copies of `src` into `dst` (the memcpy limit, measured beside each trial).
fn copy_trial(src: &[u8], dst: &mut [u8], n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        dst.copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(&mut *dst);
    }
    t.elapsed().as_secs_f64()
}

/// Median round trip of two threads bouncing a counter through one cache line, in µs.
fn atomic_rtt_us(iters: usize) -> f64 {
    let a = Arc::new(AtomicU64::new(0));
    let b = Arc::clone(&a);
    let n = iters as u64;
    let echo = std::thread::spawn(move || {
        for i in 0..n {
            let deadline = Instant::now() + Duration::from_secs(5);
            while b.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
                if Instant::now() > deadline {
                    return;
                }
            }
            b.store(2 * i + 2, Ordering::Release);
        }
    });
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..n {
        let t = Instant::now();
        a.store(2 * i + 1, Ordering::Release);
        let deadline = t + Duration::from_secs(5);
        while a.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
            if Instant::now() > deadline {
                break;
            }
        }
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let _ = echo.join();
    median(&mut rtts)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn p2p(w: &Communicator, backend: &str, sizes: &[usize], iters: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let me = w.rank();
    // Latency: 8-byte ping-pong.
    let mut b8 = [0u8; 8];
    let mut rtts = Vec::with_capacity(iters);
    for _ in 0..iters + 100 {
        let t = Instant::now();
        if me == 0 {
            w.send(1, &b8, 9)?;
            w.recv(1, &mut b8, 9)?;
        } else {
            w.recv(0, &mut b8, 9)?;
            w.send(0, &b8, 9)?;
        }
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    if me == 0 {
        let rtt = median(&mut rtts[100..]);
        let floor = atomic_rtt_us(iters);
        out.push(line(
            format!("latency {backend} round trip 8 B"),
            rtt,
            "us",
            floor,
        ));
    }
    for &size in sizes {
        let buf = vec![7u8; size];
        let mut rbuf = vec![0u8; size];
        let n = if size >= 1 << 28 { 1 } else { reps(size) };
        w.barrier()?;
        // Trial 0 is a warm-up (faults pages in on both sides); the best of the rest counts.
        let mut best = f64::MAX;
        let mut best_copy = f64::MAX;
        for trial in 0..TRIALS + 1 {
            if me == 0 {
                // The limit is measured in the same trial, under the same load.
                let c = copy_trial(&buf, &mut rbuf, n);
                if trial > 0 {
                    best_copy = best_copy.min(c);
                }
                let mut ack = [0u8; 1];
                let t = Instant::now();
                for _ in 0..n {
                    w.send(1, &buf, 1)?;
                }
                w.recv(1, &mut ack, 2)?;
                if trial > 0 {
                    best = best.min(t.elapsed().as_secs_f64());
                }
            } else {
                for _ in 0..n {
                    w.recv(0, &mut rbuf, 1)?;
                }
                w.send(0, &[1], 2)?;
            }
        }
        if me == 0 {
            let case = format!("p2p {backend} {}", human(size));
            out.push(throughput(case, size * n, best, best_copy));
        }
    }
    Ok(out)
}

fn bcast(w: &Communicator, backend: &str, sizes: &[usize]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let n_ranks = w.world_size();
    for &size in sizes {
        let mut buf = vec![3u8; size];
        let n = if size >= 1 << 28 {
            1
        } else {
            reps(size).min(500)
        };
        w.broadcast(0, &mut buf)?; // warm-up
        let mut scratch = if w.rank() == 0 {
            vec![0u8; size]
        } else {
            Vec::new()
        };
        let mut secs = f64::MAX;
        let mut copy = f64::MAX;
        for _trial in 0..TRIALS {
            if w.rank() == 0 {
                copy = copy.min(copy_trial(&buf, &mut scratch, n));
            }
            w.barrier()?;
            let t = Instant::now();
            for _ in 0..n {
                w.broadcast(0, &mut buf)?;
            }
            w.barrier()?;
            secs = secs.min(t.elapsed().as_secs_f64());
        }
        if w.rank() == 0 {
            let case = format!("broadcast {backend} x{n_ranks} {}", human(size));
            out.push(throughput(case, size * n, secs, copy));
        }
    }
    Ok(out)
}
