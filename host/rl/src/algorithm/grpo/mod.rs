//! GRPO: group-relative advantages and the train batch built from a rollout.
//!
//! Each prompt is sampled `group_size` times; a completion's advantage is its reward minus
//! the group's mean, divided by a scale ([`ScaleRewards`]: the group's standard deviation by
//! default, plus a small epsilon). A group whose rewards are all equal carries no signal:
//! its advantages are zero, and it is left out of the batch unless a KL penalty needs every
//! sequence; with DAPO's dynamic sampling ([`Sampling`]) the step samples more prompts in
//! its place. A KL penalty goes into the loss, or into the rewards before the advantages
//! ([`kl_penalised`]). The loss itself (PPO-clip with optional KL to the reference) is the
//! trainer's; its definition is shared by every trainer (see the native plugin's `loss.rs`).

use crate::config::{AlgorithmSection, KlEstimator, KlIn, LossAgg, Ratio, ScaleRewards};
use crate::rollout::Rollout;
use tandem_plugin_api::{
    LossAggregation, LossConfig, LossKind, PolicyLoss, RVec, RatioLevel, TrainBatch, TrainSequence,
};

/// The epsilon added to the scale of the advantages.
const EPS: f32 = 1e-4;

/// One sampled completion with its reward.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Which group (prompt) it belongs to.
    pub group: usize,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Completion token ids.
    pub completion: Vec<u32>,
    /// The engine's logprob of every completion token (the behaviour policy).
    pub logprobs: Vec<f32>,
    /// Reward in `[0, 1]`.
    pub reward: f32,
    /// The policy version (the engines' weight version) that generated every token of it.
    pub version: u64,
    /// Which assistant turn of a multi-turn trajectory it is (`None`: a single-turn sample).
    /// Its `prompt` is then everything before the turn, exactly as the engine saw it.
    pub turn: Option<Turn>,
}

/// A sample's place in its multi-turn trajectory (see [`crate::turns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The trajectory's id in its step (never reused: a retry gets a new one).
    pub trajectory: u64,
    /// The turn's index, from 0.
    pub index: u32,
    /// The trajectory's assistant turns.
    pub of: u32,
}

impl Sample {
    /// Whether it opens its trajectory (every single-turn sample does): the samples a
    /// trajectory's reward is counted once by.
    pub fn opens(&self) -> bool {
        self.turn.is_none_or(|t| t.index == 0)
    }
}

/// Advantage of every sample: `(r - mean(group)) / (std(group) + eps)`.
pub fn advantages(samples: &[Sample]) -> Vec<f32> {
    let rewards: Vec<f32> = samples.iter().map(|s| s.reward).collect();
    scaled_advantages(samples, &rewards, ScaleRewards::Group)
}

/// Mean and (population) standard deviation of `values`, summed in `f32` in their order.
fn mean_std(values: impl Iterator<Item = f32>) -> (f32, f32) {
    let (mut sum, mut sq, mut n) = (0f32, 0f32, 0f32);
    for r in values {
        sum += r;
        sq += r * r;
        n += 1.0;
    }
    let mean = sum / n;
    let var = (sq / n - mean * mean).max(0.0);
    (mean, var.sqrt())
}

/// Advantage of every sample from `rewards` (one per sample): `r − mean(group)`, divided by
/// `std(group) + eps` ([`ScaleRewards::Group`]), by the standard deviation of all the
/// rewards `+ eps` (`Batch`), or by nothing (`None`). A group whose rewards are all equal
/// (standard deviation below 1e-6) gets 0 whatever the scale.
pub fn scaled_advantages(samples: &[Sample], rewards: &[f32], scale: ScaleRewards) -> Vec<f32> {
    let groups = samples.iter().map(|s| s.group + 1).max().unwrap_or(0);
    let mut sum = vec![0f32; groups];
    let mut sq = vec![0f32; groups];
    let mut n = vec![0f32; groups];
    // A trajectory counts once, whatever its turns (each turn carries its reward).
    for (s, &r) in samples.iter().zip(rewards).filter(|(s, _)| s.opens()) {
        sum[s.group] += r;
        sq[s.group] += r * r;
        n[s.group] += 1.0;
    }
    let opening = samples.iter().zip(rewards).filter(|(s, _)| s.opens());
    let (_, batch_std) = mean_std(opening.map(|(_, &r)| r));
    samples
        .iter()
        .zip(rewards)
        .map(|(s, &r)| {
            let g = s.group;
            let mean = sum[g] / n[g];
            let var = (sq[g] / n[g] - mean * mean).max(0.0);
            let std = var.sqrt();
            if std < 1e-6 {
                return 0.0;
            }
            match scale {
                ScaleRewards::Group => (r - mean) / (std + EPS),
                ScaleRewards::Batch => (r - mean) / (batch_std + EPS),
                ScaleRewards::None => r - mean,
            }
        })
        .collect()
}

/// A completion's KL to the reference, summed over its tokens: `logprobs` under the policy
/// that sampled it, `refs` under the reference; per token `d = ref − lp`, `k1 = −d`,
/// `k3 = exp(d) − d − 1`.
pub fn sequence_kl(logprobs: &[f32], refs: &[f32], estimator: KlEstimator) -> f32 {
    logprobs
        .iter()
        .zip(refs)
        .map(|(&lp, &r)| {
            let d = r - lp;
            match estimator {
                KlEstimator::K1 => -d,
                KlEstimator::K3 => d.exp() - d - 1.0,
            }
        })
        .sum()
}

/// The rewards with the KL penalty in them: `reward − coef · Σ_t kl_t` per sample, with the
/// sample's reference logprobs in `refs` (one row per sample; an empty row: no KL).
pub fn kl_penalised(
    samples: &[Sample],
    refs: &[Vec<f32>],
    coef: f32,
    estimator: KlEstimator,
) -> Vec<f32> {
    samples
        .iter()
        .zip(refs)
        .map(|(s, r)| s.reward - coef * sequence_kl(&s.logprobs, r, estimator))
        .collect()
}

/// The rollout rounds of one step with DAPO's dynamic sampling: each round's groups whose
/// rewards are all equal are dropped, and the next round samples as many new prompts as
/// groups are still missing, until `target` groups carry signal or `max_rounds` rounds were
/// generated. Without dynamic sampling (`max_rounds = 0`) the one round is kept whole.
#[derive(Debug, Default)]
pub struct Sampling {
    target: usize,
    max_rounds: u32,
    /// Rounds generated so far.
    pub rounds: u32,
    /// Every sample of every round, groups numbered across the rounds.
    samples: Vec<Sample>,
    exact: usize,
    /// Groups generated so far (the next round's first group number).
    groups: usize,
    /// Groups with signal, by number, in order.
    kept: Vec<usize>,
    /// Groups dropped for want of signal.
    pub dropped: usize,
    /// Scoring's tally over the rounds.
    tally: crate::env::ScoreTally,
    /// `(item id, reason)` of every failed sample of the rounds.
    failures: Vec<(String, String)>,
    /// The ids of the rounds' problems, in order.
    items: Vec<String>,
    /// With tools: the rounds' tool calls.
    calls: Option<crate::turns::Calls>,
    /// The rounds' trajectories by state.
    ledger: crate::rollout::Ledger,
}

impl Sampling {
    /// Rounds of `target` groups, at most `max_rounds` of them (0: no dynamic sampling).
    pub fn new(target: u32, max_rounds: u32) -> Sampling {
        Sampling {
            target: target as usize,
            max_rounds,
            ..Sampling::default()
        }
    }

    /// Whether groups without signal are dropped (and replaced).
    pub fn dynamic(&self) -> bool {
        self.max_rounds > 0
    }

    /// Adds a round's rollout: its groups follow those of the rounds before.
    pub fn add(&mut self, round: Rollout) {
        self.rounds += 1;
        self.exact += round.exact;
        self.tally.add(&round.tally);
        self.failures.extend(round.failures);
        self.items.extend(round.items);
        if let Some(c) = &round.calls {
            self.calls.get_or_insert_default().add(c);
        }
        // Trajectory ids follow those of the rounds before, as groups do.
        let first_id = self.ledger.started;
        self.ledger.add(&round.ledger);
        let first = self.groups;
        let count = round.samples.iter().map(|s| s.group + 1).max().unwrap_or(0);
        for g in 0..count {
            let rewards = round.samples.iter().filter(|s| s.group == g);
            let mut it = rewards.map(|s| s.reward);
            let head = it.next();
            let signal = head.is_some_and(|h| it.any(|r| r != h));
            if head.is_none() {
                continue;
            }
            if signal && self.kept.len() < self.target {
                self.kept.push(first + g);
            } else {
                self.dropped += 1;
            }
        }
        self.groups += count;
        self.samples.extend(round.samples.into_iter().map(|mut s| {
            s.group += first;
            if let Some(t) = &mut s.turn {
                t.trajectory += first_id;
            }
            s
        }));
    }

    /// Prompts of the next round, `None` when the step has sampled enough.
    pub fn next_round(&self) -> Option<u32> {
        let missing = self.target.saturating_sub(self.kept.len());
        (self.dynamic() && self.rounds < self.max_rounds && missing > 0).then_some(missing as u32)
    }

    /// Groups with signal kept for training.
    pub fn kept(&self) -> usize {
        self.kept.len()
    }

    /// Every sample generated (what the step's reward figures are of), and the samples
    /// trained on: every sample without dynamic sampling, else those of the kept groups.
    pub fn finish(self) -> (Rollout, Vec<Sample>) {
        let train = if self.dynamic() {
            self.samples
                .iter()
                .filter(|s| self.kept.contains(&s.group))
                .cloned()
                .collect()
        } else {
            self.samples.clone()
        };
        let all = Rollout {
            samples: self.samples,
            exact: self.exact,
            tally: self.tally,
            failures: self.failures,
            items: self.items,
            calls: self.calls,
            ledger: self.ledger,
        };
        (all, train)
    }
}

/// The train batch of a rollout; sequences without signal are dropped unless `keep_all`.
pub fn batch(
    samples: &[Sample],
    advantages: &[f32],
    loss: LossConfig,
    keep_all: bool,
) -> TrainBatch {
    let sequences = samples
        .iter()
        .zip(advantages)
        .filter(|(s, a)| (keep_all || **a != 0.0) && !s.completion.is_empty())
        .map(|(s, &a)| {
            let mut tokens = s.prompt.clone();
            tokens.extend(&s.completion);
            TrainSequence {
                tokens: RVec::from(tokens),
                prompt_len: s.prompt.len() as u32,
                advantage: a,
                old_logprobs: RVec::from(s.logprobs.clone()),
                ref_logprobs: RVec::new(),
            }
        })
        .collect::<Vec<_>>();
    TrainBatch {
        sequences: RVec::from(sequences),
        loss,
    }
}

/// The loss settings of a GRPO step.
pub fn loss(learning_rate: f32, clip_eps: f32, kl_coef: f32, grad_clip: f32) -> LossConfig {
    loss_clipped(learning_rate, (clip_eps, clip_eps), kl_coef, grad_clip)
}

/// The loss settings of a GRPO step whose ratio is clipped to `[1 − low, 1 + high]`.
pub fn loss_clipped(
    learning_rate: f32,
    (low, high): (f32, f32),
    kl_coef: f32,
    grad_clip: f32,
) -> LossConfig {
    LossConfig {
        kind: LossKind::Grpo,
        clip_eps_low: low,
        clip_eps_high: high,
        kl_coef,
        learning_rate,
        grad_clip,
    }
}

/// The policy-loss variant `[algorithm]` names: Dr. GRPO's constant normaliser is
/// `max_tokens`; the estimator is the loss's only with the KL in the loss (else the
/// default, k3, which the loss does not read: its KL weight is 0). The defaults make
/// [`PolicyLoss::default`], the loss `train_step` minimises.
pub fn policy_loss(a: &AlgorithmSection) -> PolicyLoss {
    let kl_in_loss = a.kl_in == KlIn::Loss;
    PolicyLoss {
        aggregation: match a.loss_agg {
            LossAgg::TokenMean => LossAggregation::TokenMean,
            LossAgg::SeqMean => LossAggregation::SequenceMean,
            LossAgg::DrGrpo => LossAggregation::ConstantLength,
        },
        constant_length: a.max_tokens,
        ratio: match a.ratio {
            Ratio::Token => RatioLevel::Token,
            Ratio::Sequence => RatioLevel::Sequence,
        },
        kl_estimator: match a.kl_estimator {
            KlEstimator::K1 if kl_in_loss => tandem_plugin_api::KlEstimator::K1,
            _ => tandem_plugin_api::KlEstimator::K3,
        },
    }
}

/// GRPO as the loop's [`Algorithm`]: group-relative advantages scaled as `scale_rewards`
/// says, sequences without signal left out (unless a KL in the loss needs every one), the
/// loss variant `[algorithm]` names through `train_step_policy` (the default loss through
/// `train_step`, as always).
pub struct Grpo {
    /// `[algorithm]`.
    settings: AlgorithmSection,
    /// The policy-loss variant.
    policy: PolicyLoss,
}

impl Grpo {
    /// GRPO with the plan's settings.
    pub fn new(plan: &crate::config::RunPlan) -> Grpo {
        Grpo {
            policy: policy_loss(&plan.algorithm),
            settings: plan.algorithm.clone(),
        }
    }
}

impl super::Algorithm for Grpo {
    fn name(&self) -> &'static str {
        "grpo"
    }

    fn prepare(
        &mut self,
        _cx: &mut super::StepCx<'_>,
        samples: &[Sample],
        rewards: &[f32],
    ) -> Result<(super::Trained, Vec<f32>), crate::error::RlError> {
        let a = &self.settings;
        let adv = scaled_advantages(samples, rewards, a.scale_rewards);
        let loss = loss_clipped(a.learning_rate, a.clip_range(), kl_in_loss(a), a.grad_clip);
        let keep_all = loss.kl_coef > 0.0;
        let trained = super::Trained {
            batch: batch(samples, &adv, loss, keep_all),
            advantages: None,
        };
        Ok((trained, adv))
    }

    fn actor_step(
        &self,
        actor: &tandem_runtime::launch::RemoteTrainer,
        trained: &super::Trained,
    ) -> Result<Vec<tandem_plugin_api::Metric>, crate::error::RlError> {
        let batch = trained.batch.clone();
        // Per-token advantages: an off-policy correction weighted them.
        Ok(match (&trained.advantages, self.policy.is_default()) {
            (Some(adv), _) => actor.train_step_advantages(batch, self.policy, adv.clone())?,
            (None, true) => actor.train_step(batch)?,
            (None, false) => actor.train_step_policy(batch, self.policy)?,
        })
    }
}

/// The KL weight of the loss: `kl_coef`, 0 when the KL goes into the rewards.
pub fn kl_in_loss(a: &AlgorithmSection) -> f32 {
    match a.kl_in == KlIn::Reward && a.kl_coef > 0.0 {
        true => 0.0,
        false => a.kl_coef,
    }
}

#[cfg(test)]
mod tests;
