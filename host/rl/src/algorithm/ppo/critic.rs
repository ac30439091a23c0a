//! PPO's critic as the loop drives it: its worker, what of its memory is offloaded, its
//! value and training calls, each an event under the name `critic`.
//!
//! Colocated, the critic offloads every tag it declares releasable in the staged onload's
//! first stage (it takes no part in the sync) and comes back before it values the next
//! rollout, after the engines' drained offload.

use crate::error::RlError;
use crate::events::EventLog;
use std::path::Path;
use tandem_plugin_api::{Metric, TrainBatch, ValueTargets};
use tandem_runtime::launch::RemoteTrainer;

/// The critic's name in events, metrics and the ledger.
pub const NAME: &str = "critic";

/// The run's critic.
pub struct Critic {
    remote: RemoteTrainer,
    /// Tags offloaded in the staged onload (empty: never offloaded).
    offload: Vec<String>,
    /// Whether they are offloaded now.
    offloaded: bool,
}

impl Critic {
    /// The critic on `remote`, offloading `offload` in the staged onload.
    pub fn new(remote: RemoteTrainer, offload: Vec<String>) -> Critic {
        Critic {
            remote,
            offload,
            offloaded: false,
        }
    }

    /// Brings its memory back, when offloaded.
    fn onload(&mut self, step: u32, events: &EventLog) -> Result<(), RlError> {
        if self.offloaded {
            self.remote.onload(&self.offload)?;
            events.record(step, NAME, "onload", &self.offload.join(","));
            self.offloaded = false;
        }
        Ok(())
    }

    /// Offloads its memory (colocated runs).
    pub fn offload(&mut self, step: u32, events: &EventLog) -> Result<(), RlError> {
        if !self.offloaded && !self.offload.is_empty() {
            self.remote.offload(&self.offload)?;
            events.record(step, NAME, "offload", &self.offload.join(","));
            self.offloaded = true;
        }
        Ok(())
    }

    /// The values of every completion token of `batch` (onloaded first).
    pub fn values(
        &mut self,
        step: u32,
        events: &EventLog,
        batch: &TrainBatch,
    ) -> Result<Vec<Vec<f32>>, RlError> {
        self.onload(step, events)?;
        let values = self.remote.compute_values(batch.clone())?;
        let lens: Vec<usize> = batch
            .sequences
            .iter()
            .map(|s| s.tokens.len() - s.prompt_len as usize)
            .collect();
        let got: Vec<usize> = values.iter().map(Vec::len).collect();
        if got != lens {
            return Err(RlError::failed(format!(
                "the critic valued {got:?} completion tokens per sequence, the batch has {lens:?}"
            )));
        }
        events.record(step, NAME, "values", &format!("{} sequences", values.len()));
        Ok(values)
    }

    /// `steps` value steps on `targets`; the last step's figures.
    pub fn train(
        &mut self,
        step: u32,
        events: &EventLog,
        batch: &TrainBatch,
        targets: &ValueTargets,
        steps: u32,
    ) -> Result<Vec<Metric>, RlError> {
        self.onload(step, events)?;
        let mut out = Vec::new();
        for _ in 0..steps {
            out = self
                .remote
                .train_step_value(batch.clone(), targets.clone())?;
        }
        events.record(step, NAME, "train", &format!("{steps} value steps"));
        Ok(out)
    }

    /// Writes its checkpoint into `dir` (its memory back first: a save reads the weights).
    pub fn save(&mut self, dir: &Path) -> Result<(), RlError> {
        let was = self.offloaded;
        if was {
            self.remote.onload(&self.offload)?;
        }
        self.remote.save_checkpoint(&dir.to_string_lossy())?;
        if was {
            self.remote.offload(&self.offload)?;
        }
        Ok(())
    }

    /// Loads its checkpoint from `dir`.
    pub fn load(&mut self, dir: &Path) -> Result<(), RlError> {
        self.remote.load_checkpoint(&dir.to_string_lossy())?;
        Ok(())
    }

    /// Its memory-ledger bytes (`None` when its stats do not answer).
    pub fn ledger(&self) -> Option<(String, u64)> {
        let s = self.remote.stats().ok()?;
        Some((
            NAME.into(),
            crate::metrics::bytes_with_prefix(&s, "allocated_bytes."),
        ))
    }
}
