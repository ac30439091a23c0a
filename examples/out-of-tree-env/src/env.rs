//! The `countdown` environment: split `train` is endless (problem `i` of the training stream,
//! skipping any held-out question), split `held_out` is `[eval] problems` problems of a
//! stream of their own (no question twice); the reward reads the expression on the
//! completion's last line and scores `0.2 * valid_expression + 0.8 * correct`.

use crate::expr;
use crate::options::Options;
use crate::problem::Problem;
use std::collections::HashSet;
use tandem_plugin_api::sdk::{EnvironmentImpl, Result};
use tandem_plugin_api::{
    EnvItem, EnvironmentInfo, HELD_OUT_SPLIT, PluginError, RString, Reward, ScoreSample, SplitInfo,
    TRAIN_SPLIT,
};

/// The problem streams.
const TRAIN_STREAM: u64 = 0;
const HELD_OUT_STREAM: u64 = 1;
/// Weights of the reward's components.
const VALID_WEIGHT: f32 = 0.2;
const CORRECT_WEIGHT: f32 = 0.8;

/// A built `countdown` environment.
pub struct Countdown {
    options: Options,
    seed: u64,
    held_out: Vec<Problem>,
    held_out_keys: HashSet<(Vec<u32>, u32)>,
}

impl Countdown {
    /// The environment of `seed` with `held_out` held-out problems.
    pub fn new(options: Options, seed: u64, held_out: u32) -> Result<Countdown> {
        let mut keys = HashSet::new();
        let mut problems = Vec::new();
        let mut index = 0u64;
        while problems.len() < held_out as usize {
            if index > u64::from(held_out) * 16 + 1024 {
                return Err(PluginError::invalid_input(format!(
                    "countdown has too few distinct problems for {held_out} held-out ones"
                ))
                .with_help("hold out fewer problems ([eval] problems) or raise numbers"));
            }
            let p = Problem::generate(&options, seed, HELD_OUT_STREAM, index);
            index += 1;
            if keys.insert(p.key()) {
                problems.push(p);
            }
        }
        Ok(Countdown {
            options,
            seed,
            held_out: problems,
            held_out_keys: keys,
        })
    }

    /// Training problem `index`: the stream's, or (when that is a held-out question) the
    /// first of its re-draws that is not.
    fn train_problem(&self, index: u64) -> Problem {
        (0u64..)
            .map(|redraw| {
                let stream = TRAIN_STREAM + 2 * redraw;
                Problem::generate(&self.options, self.seed, stream, index)
            })
            .find(|p| !self.held_out_keys.contains(&p.key()))
            .unwrap_or_else(|| Problem::generate(&self.options, self.seed, TRAIN_STREAM, index))
    }

    fn reward(&self, sample: &ScoreSample) -> Reward {
        let problem = match Problem::from_metadata(sample.item.metadata_json.as_str()) {
            Ok(p) => p,
            Err(e) => return Reward::failed(format!("item `{}`: {}", sample.item.id, e.message)),
        };
        let (valid, correct) = match expr::find(sample.completion.text.as_str()) {
            Some(e) if expr::uses_given(&e.literals, &problem.numbers) => {
                (true, e.value.integer() == Some(i128::from(problem.target)))
            }
            _ => (false, false),
        };
        let (valid, correct) = (f32::from(u8::from(valid)), f32::from(u8::from(correct)));
        Reward::ok(VALID_WEIGHT * valid + CORRECT_WEIGHT * correct)
            .with_component("valid_expression", f64::from(valid))
            .with_component("correct", f64::from(correct))
    }
}

fn item(split: &str, index: u64, p: &Problem) -> EnvItem {
    EnvItem {
        source: "countdown".into(),
        metadata_json: p.metadata_json().into(),
        ..EnvItem::text(format!("{split}-{index}"), p.prompt(), p.expression.clone())
    }
}

impl EnvironmentImpl for Countdown {
    fn describe(&self) -> Result<EnvironmentInfo> {
        let split = |name: &str, size: usize| SplitInfo {
            name: name.into(),
            size: size as u64,
        };
        let mut splits = vec![split(TRAIN_SPLIT, 0)];
        if !self.held_out.is_empty() {
            splits.push(split(HELD_OUT_SPLIT, self.held_out.len()));
        }
        Ok(EnvironmentInfo {
            splits: splits.into(),
            components: vec![RString::from("valid_expression"), RString::from("correct")].into(),
            sources: vec![RString::from("countdown")].into(),
            reward_min: 0.0,
            reward_max: VALID_WEIGHT + CORRECT_WEIGHT,
            multi_turn: false,
        })
    }

    fn item(&self, split: &str, index: u64) -> Result<EnvItem> {
        match split {
            TRAIN_SPLIT => Ok(item(split, index, &self.train_problem(index))),
            HELD_OUT_SPLIT => usize::try_from(index)
                .ok()
                .and_then(|i| self.held_out.get(i))
                .map(|p| item(split, index, p))
                .ok_or_else(|| {
                    PluginError::invalid_input(format!(
                        "held-out item {index} does not exist: the split has {} items",
                        self.held_out.len()
                    ))
                }),
            other => Err(PluginError::invalid_input(format!(
                "countdown has no split `{other}` (it has {TRAIN_SPLIT} and {HELD_OUT_SPLIT})"
            ))),
        }
    }

    fn score(&self, samples: Vec<ScoreSample>) -> Result<Vec<Reward>> {
        Ok(samples.iter().map(|s| self.reward(s)).collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tandem_plugin_api::{CompletionText, RVec};

    fn score(env: &Countdown, it: &EnvItem, text: &str) -> Reward {
        let sample = ScoreSample {
            item: it.clone(),
            completion: CompletionText {
                text: text.into(),
                token_ids: RVec::new(),
                finished: true,
            },
        };
        env.score(vec![sample]).unwrap().remove(0)
    }

    #[test]
    fn the_reference_scores_one_a_wrong_expression_less() {
        let env = Countdown::new(Options::default(), 5, 8).unwrap();
        let it = env.item(TRAIN_SPLIT, 3).unwrap();
        assert_eq!(
            score(&env, &it, &format!("Sure.\n{}", it.answer)).value,
            1.0
        );
        let p = Problem::from_metadata(it.metadata_json.as_str()).unwrap();
        // A valid expression of the given numbers that misses the target by one.
        let off = format!("{} - 1 + 1 + 1", it.answer);
        let r = score(&env, &it, &off);
        assert_eq!(
            r.value,
            if p.numbers.contains(&1) { 0.2 } else { 0.0 },
            "{off}"
        );
        assert_eq!(score(&env, &it, "I give up").value, 0.0);
        let other = score(&env, &EnvItem::text("x", "?", "1"), "1 + 1");
        assert_eq!(other.status, tandem_plugin_api::RewardStatus::Failed);
        assert!(other.reason.contains("item `x`"), "{}", other.reason);
    }

    #[test]
    fn held_out_questions_are_never_training_questions() {
        let env = Countdown::new(Options::default(), 9, 64).unwrap();
        for i in 0..2000 {
            assert!(!env.held_out_keys.contains(&env.train_problem(i).key()));
        }
    }
}
