//! PPO with a critic (`[algorithm] name = "ppo"`, `[critic]`): the `use_critic` branch of
//! the slime loop. The critic is a value model (a trainer component whose capabilities say
//! `value_model`: the native trainer puts a scalar head on the policy's architecture), a
//! worker of its own, trained beside the actor.
//!
//! A step, after the rollout and the drained offload:
//! 1. **values** — the critic is onloaded and values every completion token's state
//!    (`compute_values`);
//! 2. **advantages** — GAE over each completion (`gae.rs`: the reward at its last token,
//!    `gamma`, `lambda`), whitened over the batch's tokens (`whiten_advantages`); the
//!    λ-returns are the critic's targets;
//! 3. **critic** — `train_steps_per_rollout` value steps (`train_step_value`: the clipped
//!    value loss around the rollout's values, `value_clip`, at `critic_learning_rate`);
//! 4. **actor** — `train_steps_per_rollout` policy steps with the per-token advantages
//!    (`train_step_advantages`, the loss variant `[algorithm]` names);
//! 5. in the staged onload's first stage, with the actor's offload before the sync, the
//!    critic offloads every tag it declares releasable (colocated runs): the sync reads none
//!    of its memory, and the engines get theirs back only after.
//!
//! Its checkpoint is the directory `critic/` inside each of the actor's checkpoints.

mod critic;
pub mod gae;

use super::grpo::{Sample, batch, kl_in_loss, loss_clipped, policy_loss};
use super::{Algorithm, StepCx, Trained};
use crate::config::{AlgorithmSection, RunPlan};
use crate::error::RlError;
use crate::events::EventLog;
use critic::Critic;
use std::path::Path;
use tandem_plugin_api::{Metric, PolicyLoss, RVec, TokenAdvantages, ValueTargets};
use tandem_runtime::launch::RemoteTrainer;

/// The directory of the critic's checkpoint inside the actor's.
pub const CHECKPOINT_DIR: &str = "critic";

pub use critic::NAME as CRITIC;

/// PPO as the loop's [`Algorithm`].
pub struct Ppo {
    settings: AlgorithmSection,
    policy: PolicyLoss,
    critic: Critic,
    /// The critic's targets of the step prepared last, until the critic trains on them.
    targets: Option<(tandem_plugin_api::TrainBatch, ValueTargets)>,
}

impl Ppo {
    /// PPO with the plan's settings and its critic's worker.
    pub fn new(plan: &RunPlan, critic: RemoteTrainer) -> Ppo {
        let offload = match (plan.colocated(), &plan.critic) {
            (true, Some(c)) => c.releasable_tags.clone(),
            _ => Vec::new(),
        };
        Ppo {
            policy: policy_loss(&plan.algorithm),
            settings: plan.algorithm.clone(),
            critic: Critic::new(critic, offload),
            targets: None,
        }
    }
}

impl Algorithm for Ppo {
    fn name(&self) -> &'static str {
        "ppo"
    }

    fn prepare(
        &mut self,
        cx: &mut StepCx<'_>,
        samples: &[Sample],
        rewards: &[f32],
    ) -> Result<(Trained, Vec<f32>), RlError> {
        let a = &self.settings;
        let loss = loss_clipped(a.learning_rate, a.clip_range(), kl_in_loss(a), a.grad_clip);
        // Every sample with a completion, in order: its advantage is per token.
        let zeros = vec![0.0; samples.len()];
        let batch = batch(samples, &zeros, loss, true);
        let rewards: Vec<f32> = samples
            .iter()
            .zip(rewards)
            .filter(|(s, _)| !s.completion.is_empty())
            .map(|(_, &r)| r)
            .collect();
        let values = match batch.sequences.is_empty() {
            true => Vec::new(),
            false => self.critic.values(cx.step, cx.events, &batch)?,
        };
        let (mut adv, returns): (Vec<Vec<f32>>, Vec<Vec<f32>>) = values
            .iter()
            .zip(&rewards)
            .map(|(v, &r)| gae::gae(v, r, a.gamma, a.lambda))
            .unzip();
        if a.whiten_advantages {
            gae::whiten(&mut adv);
        }
        cx.metrics.value_mean = Some(mean(values.iter().flatten()));
        cx.metrics.return_mean = Some(mean(returns.iter().flatten()));
        // What rollouts.jsonl records of a sample: its first token's advantage.
        let mut first = adv.iter().map(|row| row.first().copied().unwrap_or(0.0));
        let per_sample = samples
            .iter()
            .map(|s| match s.completion.is_empty() {
                true => 0.0,
                false => first.next().unwrap_or(0.0),
            })
            .collect();
        let rows = |r: Vec<Vec<f32>>| r.into_iter().map(RVec::from).collect::<RVec<_>>();
        let clip = a.value_clip;
        let mut critic_batch = batch.clone();
        critic_batch.loss.learning_rate = a.critic_lr();
        self.targets = Some((
            critic_batch,
            ValueTargets {
                returns: rows(returns),
                old_values: match clip > 0.0 {
                    true => rows(values),
                    false => RVec::new(),
                },
                clip,
            },
        ));
        let trained = Trained {
            batch,
            advantages: Some(TokenAdvantages { rows: rows(adv) }),
        };
        Ok((trained, per_sample))
    }

    fn train_others(&mut self, cx: &mut StepCx<'_>) -> Result<(), RlError> {
        let Some((batch, targets)) = self.targets.take() else {
            return Ok(());
        };
        if batch.sequences.is_empty() {
            return Ok(());
        }
        let steps = self.settings.train_steps_per_rollout.max(1);
        let out = self
            .critic
            .train(cx.step, cx.events, &batch, &targets, steps)?;
        cx.metrics.value_loss = Some(metric(&out, "value_loss"));
        cx.metrics.value_clip_frac = Some(metric(&out, "value_clip_frac"));
        Ok(())
    }

    fn actor_step(&self, actor: &RemoteTrainer, trained: &Trained) -> Result<Vec<Metric>, RlError> {
        let advantages = trained
            .advantages
            .clone()
            .ok_or_else(|| RlError::failed("a PPO batch without per-token advantages"))?;
        Ok(actor.train_step_advantages(trained.batch.clone(), self.policy, advantages)?)
    }

    fn offload(&mut self, step: u32, events: &EventLog) -> Result<(), RlError> {
        self.critic.offload(step, events)
    }

    fn save(&mut self, dir: &Path) -> Result<(), RlError> {
        self.critic.save(&dir.join(CHECKPOINT_DIR))
    }

    fn load(&mut self, dir: &Path) -> Result<(), RlError> {
        self.critic.load(&dir.join(CHECKPOINT_DIR))
    }

    fn ledger(&self) -> Vec<(String, u64)> {
        self.critic.ledger().into_iter().collect()
    }
}

/// A named figure of a step's output (NaN when absent).
fn metric(m: &[Metric], name: &str) -> f64 {
    m.iter()
        .find(|x| x.name.as_str() == name)
        .map_or(f64::NAN, |x| x.value)
}

/// The mean of some numbers (NaN for none).
fn mean<'a>(xs: impl Iterator<Item = &'a f32>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), &x| (s + f64::from(x), n + 1));
    match n {
        0 => f64::NAN,
        _ => sum / n as f64,
    }
}
