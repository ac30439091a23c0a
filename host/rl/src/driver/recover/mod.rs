//! Recovery from worker deaths: a step that failed because a worker died (its process
//! gone, or — no process gone — its plugin reporting that what it drives, a vLLM server or a
//! torchrun job, is `unavailable`) gets the worker restarted and goes on from where it was (`step.rs`).
//!
//! - **Engine**: a new process for that rank, started on the job's model (or, with a bridge
//!   that restarts engines, on the last shipped checkpoint), the bridge installed and the
//!   last shipped update applied and verified — or, when the trainer is already past it, left
//!   for the step's sync, which then ships to every engine. Only its rollout share is
//!   generated again (`rollout::Pending`).
//! - **Trainer**: a new process, initialised as at the start of the run, the newest
//!   checkpoint of this run loaded (model, optimizer state, weight version), then every batch
//!   trained since that checkpoint replayed in order (`restart.rs`): the weights are those of
//!   a run that never lost its trainer. Engines that serve the trainer's own memory (`ipc`)
//!   are synced to the new trainer before they generate again.
//! - **A bridge that moves data over the transport** (`broadcast`): the transport world
//!   cannot take a new member, so every worker is started again in a new world
//!   (`relaunch.rs`), the trainer recovered as above.
//!
//! Each death, restart and replay is an event; `[run] max_restarts` (per rank),
//! `max_restarts_per_run` and `restart_backoff_secs` bound it (`budget.rs`). A worker that
//! fails to start again stops the run at once with its log tail.

mod budget;
mod relaunch;
mod restart;

pub(super) use budget::Restarts;

use super::Loop;
use super::chaos::Target;
use crate::error::RlError;
use std::time::{Duration, Instant};
use tandem_control::ControlError;
use tandem_plugin_api::ErrorCode;
use tandem_runtime::RuntimeError;

/// How long the loop waits for the launcher's monitor to report a death the failed call
/// only hinted at (a closed connection is seen before the exit is reaped).
const DEATH_GRACE: Duration = Duration::from_secs(3);

/// How long it waits for a dead process beside a plugin's `unavailable` answer.
const UNAVAILABLE_GRACE: Duration = Duration::from_millis(500);

/// A worker of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Worker {
    /// Engine rank `i`.
    Engine(usize),
    /// The trainer.
    Trainer,
}

impl Worker {
    /// Its name in events and messages.
    pub fn name(self) -> String {
        match self {
            Worker::Engine(r) => format!("engine-{r}"),
            Worker::Trainer => "trainer".into(),
        }
    }
}

impl Loop<'_> {
    /// Every worker the chaos schedule may kill: engines by rank, then the trainer.
    pub(super) fn workers(&self) -> Vec<Target> {
        let mut all: Vec<Target> = self
            .engines
            .remotes
            .iter()
            .enumerate()
            .map(|(r, e)| Target {
                name: Worker::Engine(r).name(),
                pid: e.pid(),
            })
            .collect();
        all.push(Target {
            name: Worker::Trainer.name(),
            pid: self.trainer.remote.pid(),
        });
        all
    }

    /// Recovers from `error` if a worker's death caused it (see the module doc); otherwise,
    /// or past the restart budget, the error stops the run.
    pub(super) fn recover(&mut self, step: u32, error: RlError) -> Result<(), RlError> {
        let dead = self.dead_workers(&error);
        if dead.is_empty() || self.plan.run.max_restarts == 0 {
            return Err(error);
        }
        let mut wait = Duration::ZERO;
        for w in &dead {
            let reason = self.death_reason(*w, &error);
            self.events.record(step, &w.name(), "death", &reason);
            tracing::warn!("step {step}: {} died: {reason}", w.name());
            wait = wait.max(self.restarts.charge(&w.name(), &error)?);
        }
        if !wait.is_zero() {
            tracing::info!("restarting in {:.1} s", wait.as_secs_f64());
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        if self.bridge.needs_transport() {
            self.relaunch(step)?;
        } else {
            // The trainer first: a replaced engine may need the new trainer's memory.
            if dead.contains(&Worker::Trainer) {
                self.restart_trainer(step)?;
            }
            for w in &dead {
                if let Worker::Engine(rank) = *w {
                    self.restart_engine(step, rank)?;
                }
            }
        }
        let names: Vec<String> = dead.iter().map(|w| w.name()).collect();
        self.events.record(
            step,
            "loop",
            "recovered",
            &format!("{} in {:.3} s", names.join(","), t.elapsed().as_secs_f64()),
        );
        Ok(())
    }

    /// The workers that died: every worker the launcher's monitor found dead (waiting up to
    /// [`DEATH_GRACE`] for its report, which may come after the failed call), else the worker
    /// whose plugin reported what it drives (a server, a torchrun job) as unavailable. A
    /// process found dead explains the failure: a survivor's `unavailable` beside it (a peer
    /// of a broken transport group) is its consequence, not a second death.
    fn dead_workers(&self, error: &RlError) -> Vec<Worker> {
        let unavailable = failed_peer(error);
        // A plugin that reports its server dead answers at once; the monitor reports a dead
        // process within a poll or two, so a short wait tells the two apart.
        let grace = if unavailable.is_some() {
            UNAVAILABLE_GRACE
        } else {
            DEATH_GRACE
        };
        let deadline = Instant::now() + grace;
        loop {
            let mut dead: Vec<Worker> = Vec::new();
            for (r, e) in self.engines.remotes.iter().enumerate() {
                if e.dead_reason().is_some() {
                    dead.push(Worker::Engine(r));
                }
            }
            if self.trainer.remote.dead_reason().is_some() {
                dead.push(Worker::Trainer);
            }
            if !dead.is_empty() {
                return dead;
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let Some(peer) = unavailable else {
            return Vec::new();
        };
        let engines = self.engines.remotes.iter().enumerate();
        match engines.into_iter().find(|(_, e)| e.name() == peer) {
            Some((r, _)) => vec![Worker::Engine(r)],
            None if self.trainer.remote.name() == peer => vec![Worker::Trainer],
            None => Vec::new(),
        }
    }

    /// Why `w` is counted dead: the monitor's report, else the error.
    fn death_reason(&self, w: Worker, error: &RlError) -> String {
        let reason = match w {
            Worker::Engine(r) => self.engines.remotes[r].dead_reason(),
            Worker::Trainer => self.trainer.remote.dead_reason(),
        };
        let text = reason.unwrap_or_else(|| match error {
            // The plugin's message without its help: its advice (restart the run) is what
            // the loop is about to do.
            RlError::Runtime(RuntimeError::Plugin { context, source }) => {
                format!("{context}: {}", source.message)
            }
            other => other.to_string(),
        });
        text.lines().next().unwrap_or_default().to_string()
    }
}

/// The worker whose plugin reported what it drives as unavailable (its server or torchrun job
/// died; the worker process itself lives).
fn failed_peer(error: &RlError) -> Option<String> {
    match error {
        RlError::Runtime(RuntimeError::Control(ControlError::Remote { peer, error, .. }))
            if error.code == ErrorCode::Unavailable =>
        {
            Some(peer.clone())
        }
        // What a worker's call actually returns: `From<ControlError> for RuntimeError` turns
        // `Remote` into `Plugin` with the context "<peer>: `<op>`".
        RlError::Runtime(RuntimeError::Plugin { context, source })
            if source.code == ErrorCode::Unavailable =>
        {
            context.rsplit_once(": `").map(|(peer, _)| peer.to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_plugin_api::PluginError;

    /// A plugin error as the loop gets it from a worker's call.
    fn remote(code: ErrorCode) -> RlError {
        let e = ControlError::Remote {
            peer: "engine rank 0 (pid 7, log /r/logs/engine-0.log)".into(),
            op: "generate",
            error: PluginError::new(code, "engine `vllm`: server (pid 9) died"),
        };
        RlError::from(RuntimeError::from(e))
    }

    #[test]
    fn an_unavailable_plugin_names_its_worker_and_other_errors_none() {
        assert_eq!(
            failed_peer(&remote(ErrorCode::Unavailable)).as_deref(),
            Some("engine rank 0 (pid 7, log /r/logs/engine-0.log)")
        );
        assert_eq!(failed_peer(&remote(ErrorCode::InvalidInput)), None);
        assert_eq!(failed_peer(&RlError::failed("x")), None);
    }
}
