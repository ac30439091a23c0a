//! Scoring a batch and holding the reply to the contract: one reward per sample, every `ok`
//! value finite and inside the declared range. What breaks it becomes failed samples here
//! (a call that errors: every sample of it; a reply of the wrong length: every sample; a NaN
//! or a value out of range: that sample), each with its reason, so the loop counts them and
//! trains on none of them; nothing is ever scored 0 in a failure's place.

use super::{Env, Problem};
use std::collections::BTreeMap;
use std::time::Instant;
use tandem_plugin_api::{CompletionText, RString, RVec, Reward, RewardStatus, ScoreSample};

/// One completion to score.
#[derive(Debug, Clone)]
pub struct ToScore<'a> {
    /// The problem it answers.
    pub problem: &'a Problem,
    /// The decoded completion.
    pub text: String,
    /// The token ids the engine sampled.
    pub token_ids: Vec<u32>,
    /// Generation stopped at a stop token.
    pub finished: bool,
}

/// The rewards of a batch (one per sample, in order, held to the contract) and its tally.
#[derive(Debug, Clone)]
pub struct Scored {
    /// One per sample.
    pub rewards: Vec<Reward>,
    /// What the batch counted.
    pub tally: ScoreTally,
}

/// What scoring counted: failures and their reasons, time, reward by component and source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreTally {
    /// Samples scored.
    pub samples: u64,
    /// Samples whose reward failed.
    pub failed: u64,
    /// Samples no reward applied to.
    pub not_applicable: u64,
    /// Failure reasons and how often each came.
    pub reasons: BTreeMap<String, u64>,
    /// Seconds the environment's `score` took.
    pub seconds: f64,
    /// Sum and count of each component over the `ok` samples.
    pub components: BTreeMap<String, (f64, u64)>,
    /// Sum and count of the reward of the `ok` samples of each data source.
    pub sources: BTreeMap<String, (f64, u64)>,
}

impl ScoreTally {
    /// Adds another batch's tally.
    pub fn add(&mut self, other: &ScoreTally) {
        self.samples += other.samples;
        self.failed += other.failed;
        self.not_applicable += other.not_applicable;
        self.seconds += other.seconds;
        for (k, n) in &other.reasons {
            *self.reasons.entry(k.clone()).or_default() += n;
        }
        for (map, from) in [
            (&mut self.components, &other.components),
            (&mut self.sources, &other.sources),
        ] {
            for (k, (sum, n)) in from {
                let e = map.entry(k.clone()).or_default();
                e.0 += sum;
                e.1 += n;
            }
        }
    }

    /// Mean of each entry of a (sum, count) map.
    pub fn means(map: &BTreeMap<String, (f64, u64)>) -> BTreeMap<String, f64> {
        map.iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(k, (sum, n))| (k.clone(), sum / *n as f64))
            .collect()
    }

    /// Fraction of the samples that failed.
    pub fn failed_frac(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.failed as f64 / self.samples as f64
        }
    }
}

impl Env {
    /// Scores `batch` in one call; never fails as a whole (see the module doc).
    pub fn score(&self, batch: &[ToScore<'_>]) -> Scored {
        let samples: RVec<ScoreSample> = batch
            .iter()
            .map(|s| ScoreSample {
                item: s.problem.item.clone(),
                completion: CompletionText {
                    text: RString::from(s.text.as_str()),
                    token_ids: RVec::from(s.token_ids.clone()),
                    finished: s.finished,
                },
            })
            .collect();
        let started = Instant::now();
        let reply = self.inner.score(samples).into_result();
        let seconds = started.elapsed().as_secs_f64();
        let n = batch.len();
        let rewards: Vec<Reward> = match reply {
            Err(e) => vec![Reward::failed(format!("the environment's score failed: {e}")); n],
            Ok(r) if r.len() != n => vec![
                Reward::failed(format!(
                    "the environment returned {} rewards for {n} samples",
                    r.len()
                ));
                n
            ],
            Ok(r) => r.into_iter().map(|r| self.checked(r)).collect(),
        };
        let mut tally = ScoreTally {
            samples: n as u64,
            seconds,
            ..ScoreTally::default()
        };
        for (s, r) in batch.iter().zip(&rewards) {
            match r.status {
                RewardStatus::Ok => {
                    for c in r.components.iter() {
                        let e = tally.components.entry(c.name.to_string()).or_default();
                        e.0 += c.value;
                        e.1 += 1;
                    }
                    let source = s.problem.item.source.as_str();
                    if !source.is_empty() {
                        let e = tally.sources.entry(source.to_owned()).or_default();
                        e.0 += f64::from(r.value);
                        e.1 += 1;
                    }
                }
                RewardStatus::Failed => {
                    tally.failed += 1;
                    *tally.reasons.entry(r.reason.to_string()).or_default() += 1;
                }
                RewardStatus::NotApplicable => tally.not_applicable += 1,
            }
        }
        Scored { rewards, tally }
    }

    /// `r`, or a failed reward when it breaks the contract.
    fn checked(&self, r: Reward) -> Reward {
        let (lo, hi) = (self.info.reward_min, self.info.reward_max);
        match r.status {
            RewardStatus::Ok if !r.value.is_finite() => {
                Reward::failed(format!("the reward is {}", r.value))
            }
            RewardStatus::Ok if r.value < lo || r.value > hi => Reward::failed(format!(
                "the reward {} is outside the declared range [{lo}, {hi}]",
                r.value
            )),
            RewardStatus::Ok if r.components.iter().any(|c| !c.value.is_finite()) => {
                Reward::failed("a reward component is not finite")
            }
            RewardStatus::Failed if r.reason.is_empty() => Reward {
                reason: "failed (the environment gave no reason)".into(),
                ..r
            },
            _ => r,
        }
    }
}
