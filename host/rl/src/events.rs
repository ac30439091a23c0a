//! The run's event log (`events.jsonl`): one line per orchestration call that changes a
//! component's state (pause, flush, release, resume, sync, continue, offload, onload,
//! snapshot, checkpoint), written when the call has returned. Tests read it to check the
//! ordering invariants of the drained offload and the staged onload.

use crate::error::RlError;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// One event.
#[derive(Debug, Serialize)]
struct Event<'a> {
    /// Seconds since the log was opened.
    t: f64,
    /// RL step (0 = initialisation).
    step: u32,
    /// `engine-<rank>`, `trainer`, `critic` (PPO), `drafter` or `loop`.
    target: &'a str,
    /// What happened (`pause`, `flush`, `release`, ...).
    op: &'a str,
    /// Details (tags, version, directory).
    #[serde(skip_serializing_if = "str::is_empty")]
    detail: &'a str,
}

/// Appends events to `<run_dir>/events.jsonl`; safe to share between threads.
pub struct EventLog {
    out: Mutex<BufWriter<File>>,
    start: Instant,
}

impl EventLog {
    /// Opens (appends to) the log.
    pub fn open(path: &Path) -> Result<EventLog, RlError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(RlError::io(format!("opening {}", path.display())))?;
        Ok(EventLog {
            out: Mutex::new(BufWriter::new(file)),
            start: Instant::now(),
        })
    }

    /// Records one event. A write failure is logged, never fatal to the run.
    pub fn record(&self, step: u32, target: &str, op: &str, detail: &str) {
        let e = Event {
            t: self.start.elapsed().as_secs_f64(),
            step,
            target,
            op,
            detail,
        };
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let line = serde_json::to_string(&e).unwrap_or_default();
        if let Err(err) = writeln!(out, "{line}") {
            tracing::warn!("cannot write the event log: {err}");
        }
    }

    /// Flushes buffered events to the file.
    pub fn flush(&self) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = out.flush() {
            tracing::warn!("cannot write the event log: {err}");
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.flush();
    }
}
