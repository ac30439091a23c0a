//! Memory of the worker processes during a sync: the sum of their proportional set sizes
//! (`Pss` in `/proc/<pid>/smaps_rollup`), sampled on a thread. Pss splits a page shared by
//! two processes between them, so weights the engine maps from the trainer (`ipc`) count once,
//! where the sum of the two RSS figures would count them twice.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the sampler reads the processes' Pss.
const EVERY: Duration = Duration::from_millis(10);

/// The Pss of one process in bytes (`None` once it is gone).
pub fn pss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Pss:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The summed Pss of `pids` (processes that are gone count 0).
pub fn total_pss(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|&p| pss_bytes(p)).sum()
}

/// Parks the thread for `d` (woken early by `unpark`); false as soon as `stop` is set.
fn wait(stop: &AtomicBool, d: Duration) -> bool {
    let until = std::time::Instant::now() + d;
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let now = std::time::Instant::now();
        if now >= until {
            return true;
        }
        std::thread::park_timeout(until - now);
    }
}

/// Samples the summed Pss of a changing set of processes until stopped; keeps the peak.
pub struct PeakSampler {
    pids: Arc<Mutex<Vec<u32>>>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeakSampler {
    /// Starts sampling `pids` (one sample is taken before this returns).
    pub fn start(pids: Vec<u32>) -> PeakSampler {
        let peak = Arc::new(AtomicU64::new(total_pss(&pids)));
        let pids = Arc::new(Mutex::new(pids));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, k, s) = (pids.clone(), peak.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("bridge-pss".into())
            .spawn(move || {
                // Reading smaps_rollup holds each worker's mmap lock for a time that grows
                // with its mappings (and takes a core of this 2-core class of machine): the
                // thread waits `EVERY` before its first sample (`start` took one before the
                // sync and `finish` takes one after it, so a sync shorter than that is not
                // disturbed at all), then samples at most a fifth of the time, so the sampler
                // does not slow down what it measures (e.g. an engine mapping an adapter).
                let mut pause = EVERY;
                while wait(&s, pause) {
                    let t = std::time::Instant::now();
                    let now = total_pss(&p.lock().unwrap_or_else(PoisonError::into_inner));
                    k.fetch_max(now, Ordering::SeqCst);
                    pause = EVERY.max(t.elapsed() * 4);
                }
            })
            .ok();
        PeakSampler {
            pids,
            peak,
            stop,
            thread,
        }
    }

    /// Adds a process (e.g. a restarted engine).
    pub fn add(&self, pid: u32) {
        self.pids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(pid);
    }

    /// Stops sampling (after one last sample) and returns the peak.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let last = total_pss(&self.pids.lock().unwrap_or_else(PoisonError::into_inner));
        self.peak.fetch_max(last, Ordering::SeqCst).max(last)
    }
}

impl Drop for PeakSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
