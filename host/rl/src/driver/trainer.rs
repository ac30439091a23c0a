//! The trainer as the loop drives it: its remote handle and what of its memory is offloaded.
//!
//! Colocated, the staged onload offloads the trainer in two parts: all but its weights before
//! the sync, its weights after it (the trainer half of the sync reads them); the next train
//! phase onloads whatever is offloaded. Only tags the trainer declares releasable and the
//! bridge lets go of are ever offloaded (`ipc`: never the weights).

use crate::error::RlError;
use crate::events::EventLog;
use tandem_plugin_api::tags::WEIGHTS;
use tandem_runtime::launch::RemoteTrainer;

/// The run's trainer.
pub(super) struct Trainer {
    /// The remote handle.
    pub remote: RemoteTrainer,
    /// Tags offloaded right now.
    offloaded: Vec<String>,
    /// Tags offloaded before the sync (all but the weights).
    before_sync: Vec<String>,
    /// Tags offloaded after the sync (the weights).
    after_sync: Vec<String>,
}

impl Trainer {
    /// A trainer whose staged onload offloads `offload` (empty: it is never offloaded).
    pub fn new(remote: RemoteTrainer, offload: Vec<String>) -> Trainer {
        let (after_sync, before_sync) = offload.into_iter().partition(|t| t == WEIGHTS);
        Trainer {
            remote,
            offloaded: Vec::new(),
            before_sync,
            after_sync,
        }
    }

    /// A new worker in the place of a dead one: nothing of it is offloaded.
    pub fn replace(&mut self, remote: RemoteTrainer) {
        self.remote = remote;
        self.offloaded.clear();
    }

    /// Offloads all but the weights (before the sync).
    pub fn offload_before_sync(&mut self, step: u32, events: &EventLog) -> Result<(), RlError> {
        self.offload(step, self.before_sync.clone(), events)
    }

    /// Offloads the weights (after the sync).
    pub fn offload_after_sync(&mut self, step: u32, events: &EventLog) -> Result<(), RlError> {
        self.offload(step, self.after_sync.clone(), events)
    }

    fn offload(&mut self, step: u32, tags: Vec<String>, events: &EventLog) -> Result<(), RlError> {
        if tags.is_empty() {
            return Ok(());
        }
        self.remote.offload(&tags)?;
        events.record(step, "trainer", "offload", &tags.join(","));
        self.offloaded.extend(tags);
        Ok(())
    }

    /// Brings back everything offloaded (before training).
    pub fn onload(&mut self, step: u32, events: &EventLog) -> Result<(), RlError> {
        if self.offloaded.is_empty() {
            return Ok(());
        }
        let tags = std::mem::take(&mut self.offloaded);
        self.remote.onload(&tags)?;
        events.record(step, "trainer", "onload", &tags.join(","));
        Ok(())
    }
}
