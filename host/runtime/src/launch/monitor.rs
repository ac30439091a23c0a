//! Worker processes as the controller sees them: the child handle, its log, how it ended.
//!
//! A monitor thread polls every child (`try_wait`, every [`POLL`]); when one exits without
//! having been asked to, it logs one error with the exit status and the tail of the worker's
//! log, and fails the worker's [`Channel`] so pending calls return at once. The same report
//! answers [`PeerLife::explain_exit`] when a channel's reader sees the socket close first.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tandem_control::{Channel, PeerLife, Role};

/// How often the monitor polls the children.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// Lines of a dead worker's log quoted in its report.
const TAIL_LINES: usize = 20;

/// How a worker process ended.
#[derive(Debug, Clone)]
pub struct WorkerExit {
    /// The exit status.
    pub status: ExitStatus,
    /// `exited with status 2` / `killed by signal 9 (SIGKILL)`.
    pub description: String,
    /// The description plus the last lines of the worker's log (multi-line).
    pub report: String,
}

/// One worker process.
pub(crate) struct WorkerProc {
    /// `engine rank 0 (pid 42, log <run>/logs/engine-0.log)`.
    pub name: String,
    pub role: Role,
    pub rank: u32,
    /// The process this controller started (the worker, or `srun` for it).
    pub pid: u32,
    /// Which start of the rank this is (the worker's hello names it).
    pub launch: u64,
    /// Where the worker runs, once its hello came: `host (ip)`.
    pub host: Mutex<Option<String>>,
    /// The worker runs elsewhere (`pid` is the `srun` or Ray driver that runs it).
    pub remote: bool,
    pub log_path: PathBuf,
    /// Length of the log file before this process started (its tail starts here).
    log_start: u64,
    child: Mutex<Option<Child>>,
    exit: Mutex<Option<WorkerExit>>,
    /// The controller asked it to exit (or it reported a start failure): no error on exit.
    pub expected: AtomicBool,
    /// The monitor has handled its exit.
    reported: AtomicBool,
    pub channel: Mutex<Option<Arc<Channel>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WorkerProc {
    /// A started worker: `child` is the worker itself, or what runs it elsewhere (`srun`, the
    /// Ray driver), described by `place` (`on node n1, srun `).
    pub(crate) fn new(
        role: Role,
        rank: u32,
        child: Child,
        (launch, place): (u64, Option<String>),
        log_path: PathBuf,
        log_start: u64,
    ) -> Self {
        let pid = child.id();
        let remote = place.is_some();
        let place = place.unwrap_or_default();
        WorkerProc {
            name: format!(
                "{role} rank {rank} ({place}pid {pid}, log {})",
                log_path.display()
            ),
            role,
            rank,
            pid,
            launch,
            host: Mutex::new(None),
            remote,
            log_path,
            log_start,
            child: Mutex::new(Some(child)),
            exit: Mutex::new(None),
            expected: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            channel: Mutex::new(None),
        }
    }

    /// How it ended, if it has; reaps the child on the first call after its exit.
    pub(crate) fn poll(&self) -> Option<WorkerExit> {
        let mut child = lock(&self.child);
        let status = match child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => status,
            Some(Ok(None)) => return None,
            Some(Err(e)) => {
                tracing::warn!("{}: cannot poll the process: {e}", self.name);
                return None;
            }
            None => return lock(&self.exit).clone(),
        };
        *child = None;
        let description = describe(status);
        let report = format!("the worker {description}; {}", self.log_tail());
        let exit = WorkerExit {
            status,
            description,
            report,
        };
        *lock(&self.exit) = Some(exit.clone());
        Some(exit)
    }

    /// Waits up to `wait` for the process to end.
    /// Polls every millisecond for the first 50 ms (a worker asked to exit is usually gone in
    /// a few: a checkpoint restart waits for the replaced engine inside the sync's clock),
    /// then every 10 ms.
    pub(crate) fn wait_exit(&self, wait: Duration) -> Option<WorkerExit> {
        let start = Instant::now();
        let deadline = start + wait;
        loop {
            if let Some(exit) = self.poll() {
                return Some(exit);
            }
            if Instant::now() >= deadline {
                return None;
            }
            let every = if start.elapsed() < Duration::from_millis(50) {
                1
            } else {
                10
            };
            std::thread::sleep(Duration::from_millis(every));
        }
    }

    /// Where the worker runs (`host (ip)`), once it said hello.
    pub(crate) fn host(&self) -> Option<String> {
        lock(&self.host).clone()
    }

    /// Kills the process (SIGKILL) if it still runs, and reaps it. Killing `srun` ends its
    /// remote task too (slurmd sees the step's `srun` go).
    pub(crate) fn kill(&self) {
        self.expected.store(true, Ordering::SeqCst);
        if let Some(child) = lock(&self.child).as_mut() {
            let _ = child.kill();
        }
        let _ = self.wait_exit(Duration::from_secs(5));
    }

    /// The last lines this process wrote to its log.
    fn log_tail(&self) -> String {
        let path = self.log_path.display();
        let mut text = String::new();
        let read = std::fs::File::open(&self.log_path).and_then(|mut f| {
            let end = f.seek(SeekFrom::End(0))?;
            let from = self.log_start.max(end.saturating_sub(64 << 10));
            f.seek(SeekFrom::Start(from))?;
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)?;
            text = String::from_utf8_lossy(&bytes).into_owned();
            Ok(())
        });
        if let Err(e) = read {
            return format!("its log {path} cannot be read: {e}");
        }
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.is_empty() {
            return format!("its log {path} is empty");
        }
        let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
        let mut out = format!("last {} lines of its log {path}:", tail.len());
        for line in tail {
            let line: String = line.chars().take(400).collect();
            out.push_str("\n  | ");
            out.push_str(&line);
        }
        out
    }
}

impl PeerLife for WorkerProc {
    fn explain_exit(&self, wait: Duration) -> Option<String> {
        self.wait_exit(wait).map(|e| e.report)
    }
}

/// `exited with status N`, or `killed by signal N (SIGNAME)`.
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let name = nix::sys::signal::Signal::try_from(sig).map_or("unknown", |s| s.as_str());
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            format!("was killed by signal {sig} ({name}{core})")
        }
        None => format!("ended with {status}"),
    }
}

/// The monitor thread; stops when `stop` is set.
pub(crate) fn spawn_monitor(
    procs: Arc<Mutex<Vec<Arc<WorkerProc>>>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("worker-monitor".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let list: Vec<Arc<WorkerProc>> = lock(&procs).clone();
                for p in list {
                    let Some(exit) = p.poll() else {
                        continue;
                    };
                    if p.reported.swap(true, Ordering::SeqCst) {
                        continue;
                    }
                    let channel = lock(&p.channel).take();
                    if p.expected.load(Ordering::SeqCst) {
                        tracing::debug!("{}: {}", p.name, exit.description);
                    } else {
                        tracing::error!("{}: {}", p.name, exit.report);
                    }
                    if let Some(ch) = channel {
                        ch.fail(exit.report.clone());
                    }
                }
                lock(&procs).retain(|p| !p.reported.load(Ordering::SeqCst));
                std::thread::sleep(POLL);
            }
        })
}
