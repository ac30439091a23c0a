//! The staged onload that ends a step (and the init), around the bridge's sync:
//!
//! offload the algorithm's other models (PPO's critic) and the trainer (all but its
//! weights) → the engines' weights back → **sync** →
//! offload the trainer's weights → the engines' KV cache back → `continue_generation`.
//!
//! The sync is one call, [`BridgeDriver::sync_staged`](crate::bridge::BridgeDriver::sync_staged):
//! the trainer exports first (its half reads the weights, so before any trainer offload),
//! then [`Staging`] runs the first two stages, then the bridge ships and verifies. An engine
//! about to be restarted on the new weights does not get its old ones back. Every stage's
//! wall time goes to its phase (`offload_trainer`, `onload`, `sync`).

use super::trainer::Trainer;
use super::{Loop, Phases, add_time, timed};
use crate::bridge::{SyncRecord, SyncStages};
use crate::error::RlError;
use crate::events::EventLog;
use crate::phases::Engines;
use std::time::{Duration, Instant};
use tandem_runtime::launch::{RemoteEngine, RemoteTrainer};

impl Loop<'_> {
    /// The staged onload of `step`, with the bridge's sync when the trainer's weights
    /// changed (`sync`); the sync's record.
    pub(super) fn staged_onload(
        &mut self,
        step: u32,
        sync: bool,
        phases: &mut Phases,
    ) -> Result<Option<SyncRecord>, RlError> {
        // The algorithm's own models (PPO's critic) take no part in the sync: they go first.
        timed(phases, "offload_trainer", || {
            self.algorithm.offload(step, &self.events)
        })?;
        let record = if sync {
            Some(self.sync(step, phases)?)
        } else {
            timed(phases, "offload_trainer", || {
                self.trainer.offload_before_sync(step, &self.events)
            })?;
            timed(phases, "onload", || {
                self.engines.onload_weights(&self.events, step)
            })?;
            None
        };
        timed(phases, "offload_trainer", || {
            self.trainer.offload_after_sync(step, &self.events)
        })?;
        timed(phases, "onload", || {
            self.engines.onload_rest(&self.events, step)
        })?;
        timed(phases, "onload", || {
            self.engines.continue_all(&self.events, step)
        })?;
        Ok(record)
    }

    /// The sync and the stages before it; the engines' state machines follow the update.
    fn sync(&mut self, step: u32, phases: &mut Phases) -> Result<SyncRecord, RlError> {
        let started = Instant::now();
        let mut staging = Staging {
            step,
            trainer: &mut self.trainer,
            engines: &mut self.engines,
            events: &self.events,
            phases: &mut *phases,
            staged: Duration::ZERO,
        };
        let result = self.bridge.sync_staged(&mut staging, &mut self.launcher);
        let staged = staging.staged;
        add_time(phases, "sync", started.elapsed().saturating_sub(staged));
        let rec = result?;
        self.engines.end_update(rec.restarted, rec.version)?;
        self.events.record(
            step,
            "loop",
            "sync",
            &format!(
                "version {} bytes {} restarted {} digest {} verified {}",
                rec.version, rec.bytes_moved, rec.restarted, rec.digest, rec.verified
            ),
        );
        Ok(rec)
    }
}

/// The stages the bridge runs between the trainer's export and the shipping.
struct Staging<'s> {
    step: u32,
    trainer: &'s mut Trainer,
    engines: &'s mut Engines,
    events: &'s EventLog,
    phases: &'s mut Phases,
    /// Time spent in the stages (not the sync's).
    staged: Duration,
}

impl Staging<'_> {
    fn stage(&mut self, version: u64, restarting: bool) -> Result<(), RlError> {
        let (step, events) = (self.step, self.events);
        let trainer = &mut *self.trainer;
        timed(self.phases, "offload_trainer", || {
            trainer.offload_before_sync(step, events)
        })?;
        if !restarting {
            let engines = &mut *self.engines;
            timed(self.phases, "onload", || {
                engines.onload_weights(events, step)
            })?;
            self.engines.begin_update(version)?;
        }
        Ok(())
    }
}

impl SyncStages for Staging<'_> {
    fn trainer(&self) -> &RemoteTrainer {
        &self.trainer.remote
    }

    fn engines(&mut self) -> &mut [RemoteEngine] {
        &mut self.engines.remotes
    }

    fn exported(&mut self, version: u64, restarting: bool) -> Result<(), RlError> {
        let t = Instant::now();
        let r = self.stage(version, restarting);
        self.staged += t.elapsed();
        r
    }

    fn failed(&mut self) {
        self.engines.abort_update();
    }
}
