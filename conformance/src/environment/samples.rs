//! The samples the score checks send: a [`Batch`] of items and completions (answers, wrong
//! answers, odd texts), scoring it with the one-reward-per-sample rule, and validating each
//! reward against what the environment declared.

use super::call;
use super::checks::{FAILURE_REASON, ONE_PER_SAMPLE, VALID_REWARDS};
use crate::harness::{Failure, Outcome};
use tandem_plugin_api::{
    CompletionText, EnvItem, EnvironmentBox, EnvironmentInfo, RVec, Reward, RewardStatus,
    ScoreSample,
};

/// Samples to score, with what the environment declared of its rewards.
#[derive(Clone)]
pub(crate) struct Batch {
    info: EnvironmentInfo,
    samples: Vec<ScoreSample>,
}

/// A completion of `text`: token ids are its bytes (the checks have no tokenizer).
fn completion(text: &str, finished: bool) -> CompletionText {
    CompletionText {
        text: text.into(),
        token_ids: if finished {
            text.bytes().map(u32::from).collect()
        } else {
            RVec::new()
        },
        finished,
    }
}

/// The odd completions: text and whether it finished.
fn odd_texts() -> Vec<(String, bool)> {
    vec![
        (String::new(), true),
        (" \n\t ".into(), true),
        (
            "}{)(*&^%$#@! \u{0} \u{1b}[31m \u{202e} 🙂 ∑∂ \u{fffd}".into(),
            true,
        ),
        ("=".repeat(7), false),
        ("1234567890 + - * / = ( ) ".repeat(8_000), false),
        (String::new(), false),
    ]
}

impl Batch {
    /// Each item with its answer (or `42` when it has none) and with a wrong answer.
    pub fn answers(info: EnvironmentInfo, items: &[EnvItem]) -> Batch {
        let samples = items
            .iter()
            .flat_map(|it| {
                let right = if it.answer.is_empty() {
                    "42".to_owned()
                } else {
                    it.answer.to_string()
                };
                [right, "I do not know.".into()].map(|text| ScoreSample {
                    item: it.clone(),
                    completion: completion(&text, true),
                })
            })
            .collect();
        Batch { info, samples }
    }

    /// Each item with each odd completion.
    pub fn odd(info: EnvironmentInfo, items: &[EnvItem]) -> Batch {
        let samples = items
            .iter()
            .flat_map(|it| {
                odd_texts().into_iter().map(|(text, finished)| ScoreSample {
                    item: it.clone(),
                    completion: completion(&text, finished),
                })
            })
            .collect();
        Batch { info, samples }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// The same samples in reverse order.
    pub fn reversed(&self) -> Batch {
        let mut b = self.clone();
        b.samples.reverse();
        b
    }

    /// Sample `i` alone.
    pub fn only(&self, i: usize) -> Batch {
        Batch {
            info: self.info.clone(),
            samples: self.samples[i..=i].to_vec(),
        }
    }

    /// Sample `i` in a line: its item's id and the start of its completion.
    pub fn describe(&self, i: usize) -> String {
        let s = &self.samples[i];
        format!(
            "sample {i} (item `{}`, completion of {} bytes {:.40?})",
            s.item.id,
            s.completion.text.len(),
            s.completion.text.as_str()
        )
    }

    /// Scores the batch; an error of the call is a failure of `rule`, and anything but one
    /// reward per sample a failure of [`ONE_PER_SAMPLE`].
    pub fn score(&self, env: &EnvironmentBox, rule: &'static str) -> Result<Vec<Reward>, Failure> {
        let n = self.samples.len();
        let got = call(
            env.score(RVec::from(self.samples.clone())),
            rule,
            &format!("score of {n} samples"),
        )?;
        if got.len() != n {
            return Err(Failure::new(
                ONE_PER_SAMPLE,
                format!("score of {n} samples answered {} rewards", got.len()),
            ));
        }
        Ok(got.into_vec())
    }

    /// Every reward valid for its sample: `ok` ones finite, in range, with exactly the
    /// declared components (finite); the others with a reason.
    pub fn validate(&self, rewards: &[Reward]) -> Outcome {
        let (lo, hi) = (self.info.reward_min, self.info.reward_max);
        for (i, r) in rewards.iter().enumerate() {
            let fail = |rule, what: String| {
                Err(Failure::new(rule, format!("{}: {what}", self.describe(i))))
            };
            if r.status != RewardStatus::Ok {
                if r.reason.trim().is_empty() {
                    return fail(FAILURE_REASON, format!("{:?} with no reason", r.status));
                }
                continue;
            }
            if !(r.value.is_finite() && lo <= r.value && r.value <= hi) {
                return fail(
                    VALID_REWARDS,
                    format!("reward {} is outside [{lo}, {hi}]", r.value),
                );
            }
            let mut names: Vec<&str> = r.components.iter().map(|m| m.name.as_str()).collect();
            names.sort_unstable();
            let mut declared: Vec<&str> = self.info.components.iter().map(|c| c.as_str()).collect();
            declared.sort_unstable();
            if names != declared {
                return fail(
                    VALID_REWARDS,
                    format!("components {names:?}, but the environment declares {declared:?}"),
                );
            }
            if let Some(m) = r.components.iter().find(|m| !m.value.is_finite()) {
                return fail(
                    VALID_REWARDS,
                    format!("component `{}` is {}", m.name, m.value),
                );
            }
        }
        Ok(())
    }
}

/// The prompt of an item as one string (its text, or its messages as `role: content` lines).
pub(crate) fn prompt_key(it: &EnvItem) -> String {
    if it.messages.is_empty() {
        return it.prompt.to_string();
    }
    it.messages
        .iter()
        .map(|m| format!("{}: {}\n", m.role, m.content))
        .collect()
}

/// Whether two rewards of one sample agree: the same status and, when `ok`, the same value
/// and components bit for bit (a reason may word itself differently).
pub(crate) fn same(a: &Reward, b: &Reward) -> bool {
    let bits = |r: &Reward| -> Vec<(String, u64)> {
        r.components
            .iter()
            .map(|m| (m.name.to_string(), m.value.to_bits()))
            .collect()
    };
    a.status == b.status
        && (a.status != RewardStatus::Ok
            || (a.value.to_bits() == b.value.to_bits() && bits(a) == bits(b)))
}

/// A reward in a few words.
pub(crate) fn show(r: &Reward) -> String {
    match r.status {
        RewardStatus::Ok => {
            let parts: Vec<String> = r
                .components
                .iter()
                .map(|m| format!("{}={}", m.name, m.value))
                .collect();
            format!("ok {} [{}]", r.value, parts.join(", "))
        }
        s => format!("{s:?} ({})", r.reason),
    }
}
