//! Restarting one worker in place: an engine rank brought to what the other engines serve,
//! or the trainer brought back to the loop's weight version from the newest checkpoint and
//! the batches trained since (see the module doc of `recover`).

use super::Loop;
use crate::checkpoint::{LOOP_STATE, LoopState};
use crate::error::RlError;
use crate::metrics::StepMetrics;
use std::path::Path;
use std::time::{Duration, Instant};
use tandem_control::protocol::Role;

/// How long a dead or broken worker may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

impl Loop<'_> {
    /// Replaces engine rank `rank` (see the module doc).
    pub(super) fn restart_engine(&mut self, step: u32, rank: usize) -> Result<(), RlError> {
        let name = super::Worker::Engine(rank).name();
        let old = self.engines.remotes[rank].clone();
        // Asked to exit first: a worker whose plugin drives a server stops it on the way out.
        let _ = old.exit_and_wait(EXIT_GRACE);
        let t = Instant::now();
        let start_dir = self
            .bridge
            .engine_start_dir()
            .unwrap_or_else(|| self.model.to_path_buf());
        let failed = |e: &dyn std::fmt::Display| {
            RlError::failed(format!("restarting {name} after its death failed: {e}"))
        };
        let new = self
            .launcher
            .respawn_engine(rank as u32, &start_dir)
            .map_err(|e| match e.help() {
                Some(h) => failed(&e).with_help(h),
                None => failed(&e),
            })?;
        new.start()?;
        let health = new.health()?;
        if !health.ready {
            return Err(failed(&format!("not ready after start: {}", health.detail)));
        }
        // The last shipped update is what every engine serves, unless the trainer is past it
        // (trained this step) or the engines are to follow a new trainer (`force_sync`).
        let current = self.bridge.version() == Some(self.cursor.weight_version);
        let apply = current && !self.force_sync;
        let n = self.engines.remotes.len();
        let version = self
            .bridge
            .restore_engine(&new, n, apply)
            .map_err(|e| failed(&e))?
            .unwrap_or(health.weight_version);
        if version < self.cursor.weight_version {
            self.force_sync = true;
        }
        let detail = format!(
            "pid {} version {version} in {:.3} s",
            new.pid(),
            t.elapsed().as_secs_f64()
        );
        self.engines.replace(rank, new, version);
        self.events.record(step, &name, "restart", &detail);
        tracing::info!("step {step}: {name} restarted ({detail})");
        Ok(())
    }

    /// Replaces the trainer (see the module doc): a new worker, its init, the newest
    /// checkpoint of this run, then the batches trained since, in order; its weight version
    /// must come out as the loop's.
    pub(super) fn restart_trainer(&mut self, step: u32) -> Result<(), RlError> {
        let _ = self.trainer.remote.exit_and_wait(EXIT_GRACE);
        let t = Instant::now();
        let failed = |e: &dyn std::fmt::Display| {
            RlError::failed(format!(
                "restarting the trainer after its death failed: {e}"
            ))
        };
        let spec = self
            .launcher
            .spec(Role::Trainer, 0)
            .cloned()
            .ok_or_else(|| failed(&"the launcher has no spec of trainer rank 0"))?;
        let new = self
            .launcher
            .spawn_trainers(&[spec])
            .map_err(|e| match e.help() {
                Some(h) => failed(&e).with_help(h),
                None => failed(&e),
            })?
            .pop()
            .ok_or_else(|| failed(&"no trainer worker started"))?;
        self.restore_trainer(step, new)?;
        // Engines serving the old trainer's memory (`ipc`) follow the new one before they
        // generate again.
        if self.bridge.plan().sync_at_start {
            self.force_sync = true;
        }
        let detail = format!(
            "pid {} version {} in {:.3} s",
            self.trainer.remote.pid(),
            self.cursor.weight_version,
            t.elapsed().as_secs_f64()
        );
        self.events.record(step, "trainer", "restart", &detail);
        tracing::info!("step {step}: the trainer restarted ({detail})");
        Ok(())
    }
}

impl Loop<'_> {
    /// Puts `new`, a trainer worker just started, in the trainer's place and brings it to the
    /// loop's weight version: its init (with `ref`), the newest checkpoint of this run, the
    /// batches trained since, in order.
    pub(super) fn restore_trainer(
        &mut self,
        step: u32,
        new: tandem_runtime::launch::RemoteTrainer,
    ) -> Result<(), RlError> {
        let resume = match &self.last_checkpoint {
            Some(dir) => Some((dir.clone(), loop_state(dir)?)),
            None => None,
        };
        let kl = self.plan.algorithm.kl_coef > 0.0;
        let start = super::super::init::init_trainer(&new, &self.events, step, kl, &resume)?;
        self.trainer.replace(new);
        let target = self.cursor.weight_version;
        self.cursor.weight_version = start.weight_version;
        let batches = self.replay.clone();
        for (s, batch) in &batches {
            let mut ignored = StepMetrics::default();
            self.optimise(batch.clone(), *s, &mut ignored)?;
        }
        if batches.is_empty() {
            self.trainer.remote.snapshot("actor")?;
        }
        if self.cursor.weight_version != target {
            return Err(RlError::failed(format!(
                "restoring the trainer: replaying {} batch(es) from {} reached weight version {}, \
                 the run was at {target}",
                batches.len(),
                resume
                    .as_ref()
                    .map_or("the job's model".into(), |(d, _)| d.display().to_string()),
                self.cursor.weight_version
            )));
        }
        let steps: Vec<String> = batches.iter().map(|(s, _)| s.to_string()).collect();
        self.events.record(
            step,
            "trainer",
            "replay",
            &format!("steps [{}]", steps.join(",")),
        );
        Ok(())
    }
}

/// The loop state saved with checkpoint `dir`.
fn loop_state(dir: &Path) -> Result<LoopState, RlError> {
    let path = dir.join(LOOP_STATE);
    let text = std::fs::read_to_string(&path)
        .map_err(RlError::io(format!("reading {}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| RlError::failed(format!("{}: not a loop state ({e})", path.display())))
}
