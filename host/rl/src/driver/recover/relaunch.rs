//! Recovery when the bridge moves data over the transport (`broadcast`): a transport world
//! cannot take a new member (its groups are fixed when the members join, as NCCL
//! communicators are), so every worker stops and the run's workers start again in a new
//! world — the engines from the job's model, the trainer restored from the newest
//! checkpoint and the batches since — and the bridge ships the trainer's weights to every
//! engine. The step's finished rollout shares are the controller's and are kept.

use super::Loop;
use crate::driver::Phases;
use crate::error::RlError;
use std::time::{Duration, Instant};

/// How long each worker may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

impl Loop<'_> {
    /// Stops every worker and starts the run's workers again in a new transport world.
    pub(super) fn relaunch(&mut self, step: u32) -> Result<(), RlError> {
        let t = Instant::now();
        for e in &self.engines.remotes {
            let _ = e.exit_and_wait(EXIT_GRACE);
        }
        let _ = self.trainer.remote.exit_and_wait(EXIT_GRACE);
        // The old world's store goes before the new one starts.
        self._world = None;
        let world = super::super::launch::bridge_world(&self.launcher, self.plan, &self.bridge)?;
        let (engines, trainer) = self.launch.spawn(
            &mut self.launcher,
            &self.bridge,
            world.as_ref(),
            &self.events,
        )?;
        self._world = world;
        self.engines = engines;
        self.engines.drained_offload(&self.events, step)?;
        self.restore_trainer(step, trainer)?;
        self.bridge.setup(
            &self.trainer.remote,
            &mut self.engines.remotes,
            &mut self.launcher,
        )?;
        let mut phases = Phases::new();
        self.staged_onload(step, true, &mut phases)?;
        self.force_sync = false;
        let detail = format!(
            "{} engine(s) and the trainer in {:.3} s",
            self.engines.remotes.len(),
            t.elapsed().as_secs_f64()
        );
        self.events.record(step, "loop", "relaunch", &detail);
        tracing::info!("step {step}: relaunched every worker ({detail})");
        Ok(())
    }
}
