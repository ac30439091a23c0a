//! [`Tracker`]: the trackers of a running run, on their own thread. The loop calls
//! [`Tracker::notify`] after each `metrics.jsonl` line and never waits; the thread sends each
//! tracker its backlog; warnings come back through [`Tracker::warnings`]. At the end,
//! [`Tracker::finish`] waits (up to a limit) for the last backlog and ends the trackers' runs.

use crate::error::TrackError;
use crate::section::TrackPlan;
use crate::sinks::{PushReport, RunInfo, Sinks};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::thread::JoinHandle;
use std::time::Duration;

enum Msg {
    Notify,
    Finish(Option<PathBuf>, bool, Sender<PushReport>),
}

/// The trackers of a run, sending from their own thread.
pub struct Tracker {
    tx: Sender<Msg>,
    warnings: Receiver<String>,
    thread: Option<JoinHandle<()>>,
    run_dir: PathBuf,
}

impl Tracker {
    /// Starts the trackers of `plan` (`None` when it names none). Only the run directory's
    /// tracking state can fail here; a tracker that is down is a warning later.
    pub fn start(plan: &TrackPlan, run: RunInfo) -> Result<Option<Tracker>, TrackError> {
        if plan.is_empty() {
            return Ok(None);
        }
        let run_dir = run.run_dir.clone();
        let mut sinks = Sinks::new(plan, run)?;
        let (tx, rx) = channel::<Msg>();
        let (wtx, warnings) = channel::<String>();
        let thread = std::thread::Builder::new()
            .name("tracking".into())
            .spawn(move || {
                while let Ok(msg) = rx.recv() {
                    let msg = match msg {
                        // Notifications that queued while a send ran need one sync.
                        Msg::Notify => match drain(&rx) {
                            Some(finish) => finish,
                            None => {
                                for w in sinks.sync().0 {
                                    let _ = wtx.send(w);
                                }
                                continue;
                            }
                        },
                        finish => finish,
                    };
                    if let Msg::Finish(checkpoint, failed, reply) = msg {
                        let _ = reply.send(sinks.finish(checkpoint.as_deref(), failed));
                        return;
                    }
                }
            })
            .map_err(TrackError::io("starting the tracking thread"))?;
        Ok(Some(Tracker {
            tx,
            warnings,
            thread: Some(thread),
            run_dir,
        }))
    }

    /// `metrics.jsonl` has a new line.
    pub fn notify(&self) {
        let _ = self.tx.send(Msg::Notify);
    }

    /// The warning lines since the last call.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(w) = self.warnings.try_recv() {
            out.push(w);
        }
        out
    }

    /// Sends the last backlog, waiting at most `limit`, and ends the trackers' runs
    /// (`failed`: as failed). The lines: every warning not yet taken, and one per tracker
    /// still behind, saying how to send the rest.
    pub fn finish(
        mut self,
        checkpoint: Option<PathBuf>,
        failed: bool,
        limit: Duration,
    ) -> Vec<String> {
        let (rtx, rrx) = channel();
        let _ = self.tx.send(Msg::Finish(checkpoint, failed, rtx));
        let report = rrx.recv_timeout(limit).ok();
        let mut out = self.warnings();
        match report {
            Some(r) => {
                out.extend(r.warnings);
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
                for (name, n) in r.pending {
                    out.push(format!(
                        "warning: tracking: {name} lacks {n} steps; `tandem log push {}` sends them",
                        self.run_dir.display()
                    ));
                }
            }
            None => out.push(format!(
                "warning: tracking: the trackers did not finish in {} s; `tandem log push {}` \
                 sends what they lack",
                limit.as_secs(),
                self.run_dir.display()
            )),
        }
        out
    }
}

/// Takes every queued message; a `Finish` among them is returned (the rest were notifies).
fn drain(rx: &Receiver<Msg>) -> Option<Msg> {
    loop {
        match rx.try_recv() {
            Ok(Msg::Notify) => continue,
            Ok(finish) => return Some(finish),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => return None,
        }
    }
}
