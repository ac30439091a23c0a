//! The save phase: a checkpoint every `save_every` steps and at the last step, with the
//! loop state (its data position never past a rollout generated ahead: `--resume` generates
//! that rollout again) and what the step measured so far.

use crate::checkpoint::{self, LoopState};
use crate::driver::record::StepLog;
use crate::driver::{Loop, timed};
use crate::error::RlError;
use crate::metrics::StepMetrics;

impl Loop<'_> {
    /// A checkpoint every `save_every` steps and at the last step, with the loop state and
    /// what the step measured so far.
    pub(super) fn save(&mut self, log: &mut StepLog) -> Result<(), RlError> {
        let (step, every) = (log.step, self.plan.run.save_every);
        if !((every > 0 && step % every == 0) || step == self.cursor.total_steps) {
            return Ok(());
        }
        let state = LoopState {
            step,
            // Not past a rollout ahead: `--resume` generates it again.
            data_position: self
                .ahead
                .first_problem()
                .unwrap_or(self.cursor.data_position),
            weight_version: self.cursor.weight_version,
        };
        let partial = StepMetrics {
            phases: log.phases.clone(),
            weight_version: self.cursor.weight_version,
            ..log.metrics.clone()
        };
        let dir = timed(&mut log.phases, "save", || {
            let (trainer, algorithm) = (&self.trainer.remote, &mut self.algorithm);
            let mut also = |dir: &std::path::Path| algorithm.save(dir);
            checkpoint::save(
                &self.opts.run_dir,
                trainer,
                self.model,
                &state,
                &partial,
                &mut also,
            )
        })?;
        self.events
            .record(step, "trainer", "checkpoint", &dir.display().to_string());
        // What a resume from it continues: the events up to it are on disk with it.
        self.events.flush();
        self.last_checkpoint = Some(dir);
        // The checkpoint holds every batch trained so far: none needs replaying.
        self.replay.clear();
        Ok(())
    }
}
