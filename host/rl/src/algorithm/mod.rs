//! The algorithm seam: what an RL step trains, behind [`Algorithm`].
//!
//! The loop (`crate::driver`) owns everything a step shares whatever the algorithm: launch
//! and init, the rollout (with dynamic sampling's rounds), the drained offload, the `ref`
//! logprobs and the KL in the reward, the save, the staged onload around the sync, eval,
//! recovery (a restarted trainer replays what it trained since the checkpoint: the
//! [`Trained`] inputs), the record. An [`Algorithm`] owns the rest:
//!
//! - [`Algorithm::prepare`]: the samples trained on and their rewards → what the actor
//!   trains on ([`Trained`]: the batch, and per-token advantages where it has them);
//! - [`Algorithm::train_others`]: the models it trains beside the actor (PPO's critic), once
//!   per step, before the actor;
//! - [`Algorithm::actor_step`]: one optimiser step of the actor on [`Trained`];
//! - the memory, checkpoints, workers and figures of its own models.
//!
//! Implementations: [`grpo::Grpo`] (group-relative advantages, the loss variants) and
//! [`ppo::Ppo`] (a critic's values, GAE). [`for_plan`] picks the one `[algorithm] name`
//! names. A drafter job (`name = "drafter"`, [`drafter`]) trains no policy: it is the
//! other job the skeleton runs (`crate::driver::skeleton`), its steps its own.

pub mod drafter;
pub mod grpo;
pub mod ppo;

use crate::config::RunPlan;
use crate::error::RlError;
use crate::events::EventLog;
use crate::metrics::StepMetrics;
use grpo::Sample;
use std::path::Path;
use tandem_plugin_api::{Metric, TokenAdvantages, TrainBatch};
use tandem_runtime::launch::RemoteTrainer;

/// What the actor trains on in one step (kept until the next checkpoint: a restarted
/// trainer replays it).
#[derive(Debug, Clone)]
pub struct Trained {
    /// The batch (its loss settings included).
    pub batch: TrainBatch,
    /// One advantage per completion token of every sequence (PPO); `None`: each
    /// sequence's own `advantage`.
    pub advantages: Option<TokenAdvantages>,
}

/// What a step hands an algorithm.
pub struct StepCx<'a> {
    /// The step.
    pub step: u32,
    /// The run's events.
    pub events: &'a EventLog,
    /// The step's figures so far.
    pub metrics: &'a mut StepMetrics,
}

/// One RL algorithm's part of a step (see the module docs).
pub trait Algorithm {
    /// Its name, as `[algorithm] name` spells it.
    fn name(&self) -> &'static str;

    /// What the actor trains on, from the samples trained on and their rewards (already
    /// less the KL with `kl_in = "reward"`); also each sample's advantage as
    /// `rollouts.jsonl` records it.
    fn prepare(
        &mut self,
        cx: &mut StepCx<'_>,
        samples: &[Sample],
        rewards: &[f32],
    ) -> Result<(Trained, Vec<f32>), RlError>;

    /// Trains its models besides the actor on the step's input; a second call for the same
    /// step (after a recovery) trains nothing.
    fn train_others(&mut self, _cx: &mut StepCx<'_>) -> Result<(), RlError> {
        Ok(())
    }

    /// One optimiser step of the actor on `trained`.
    fn actor_step(&self, actor: &RemoteTrainer, trained: &Trained) -> Result<Vec<Metric>, RlError>;

    /// Offloads its own models' memory (the staged onload's first stage).
    fn offload(&mut self, _step: u32, _events: &EventLog) -> Result<(), RlError> {
        Ok(())
    }

    /// Writes its own models' checkpoint into `dir` (beside the actor's).
    fn save(&mut self, _dir: &Path) -> Result<(), RlError> {
        Ok(())
    }

    /// Loads its own models from the checkpoint `dir` (`--resume`).
    fn load(&mut self, _dir: &Path) -> Result<(), RlError> {
        Ok(())
    }

    /// Its own workers' memory-ledger bytes, by name.
    fn ledger(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// The algorithm `plan` names, with `critic` its value model's worker (PPO; spawned by the
/// loop from `plan.critic`).
pub fn for_plan(plan: &RunPlan, critic: Option<RemoteTrainer>) -> Box<dyn Algorithm> {
    match critic {
        Some(c) => Box::new(ppo::Ppo::new(plan, c)),
        None => Box::new(grpo::Grpo::new(plan)),
    }
}
