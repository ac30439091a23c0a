//! The environment checks catch broken environments: a small, correct fixture environment
//! (sums of two numbers, a finite training split that wraps, a generated held-out split)
//! passes every check, and copies of it, each broken in one way, fail the checks and the rule
//! they break — driven through the root module, as any plugin's environment is.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::Source;
use crate::environment::checks::DETERMINISTIC;
use crate::environment::checks::{
    FAILURE_REASON, NO_LEAK, ONE_PER_SAMPLE, PAST_END, UNIQUE_IDS, VALID_REWARDS,
};
use crate::environment::{EnvironmentSetup, NO_PANIC, failures};
use std::sync::atomic::{AtomicU64, Ordering};
use tandem_plugin_api::sdk::{self, EnvironmentImpl, Plugin};
use tandem_plugin_api::*;

const CORRECT: u8 = 0;
/// Each instance words its prompts differently.
const NONDETERMINISTIC: u8 = 1;
/// Two training items share each id.
const DUPLICATE_IDS: u8 = 2;
/// Held-out item `i` asks training item `i`'s question.
const HELD_OUT_LEAK: u8 = 3;
/// Held-out items past the split's size wrap instead of being an error.
const HELD_OUT_WRAPS: u8 = 4;
/// Held-out items past the split's size index out of bounds.
const PANICS_PAST_END: u8 = 5;
/// A correct answer scores 2 in a declared range of [0, 1].
const OUT_OF_RANGE: u8 = 6;
/// Drops the last reward of a batch.
const WRONG_COUNT: u8 = 7;
/// Answers the rewards of a batch rotated by one.
const ORDER_DEPENDENT: u8 = 8;
/// An empty completion fails with no reason.
const SILENT_FAILURE: u8 = 9;
/// Reports a component it does not declare.
const UNDECLARED_COMPONENT: u8 = 10;
/// Panics on a completion over 100 KB.
const PANICS_IN_SCORE: u8 = 11;

/// Training items in one epoch.
const TRAIN: u64 = 100;

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

struct ToyEnv<const BUG: u8> {
    seed: u64,
    held_out: u64,
    instance: u64,
}

impl<const BUG: u8> ToyEnv<BUG> {
    /// Problem `j` of the stream `salt`: the prompt and its answer.
    fn problem(&self, salt: u64, j: u64) -> (String, u64) {
        let r = mix(self.seed ^ mix(salt ^ mix(j)));
        let (a, b) = (r % 1000, (r >> 32) % 1000);
        let tag = if BUG == NONDETERMINISTIC {
            format!(" (instance {})", self.instance)
        } else {
            String::new()
        };
        (
            format!("Problem {salt}/{j}{tag}: what is {a} + {b}?"),
            a + b,
        )
    }

    fn held_out_item(&self, index: u64) -> sdk::Result<EnvItem> {
        let held: Vec<u64> = (0..self.held_out).collect();
        let i = match BUG {
            HELD_OUT_WRAPS => index % self.held_out.max(1),
            PANICS_PAST_END => held[usize::try_from(index).unwrap()],
            _ if index < self.held_out => index,
            _ => {
                return Err(PluginError::invalid_input(format!(
                    "held-out item {index} does not exist: the split has {} items",
                    self.held_out
                )));
            }
        };
        let (prompt, answer) = self.problem(if BUG == HELD_OUT_LEAK { 0 } else { 1 }, i);
        Ok(EnvItem::text(
            format!("held_out-{i}"),
            prompt,
            answer.to_string(),
        ))
    }
}

/// The last run of digits of `text`, if any.
fn last_integer(text: &str) -> Option<u64> {
    let end = text.rfind(|c: char| c.is_ascii_digit())? + 1;
    let start = text[..end]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    text[start..end].parse().ok()
}

impl<const BUG: u8> EnvironmentImpl for ToyEnv<BUG> {
    fn describe(&self) -> sdk::Result<EnvironmentInfo> {
        let split = |name: &str, size| SplitInfo {
            name: name.into(),
            size,
        };
        Ok(EnvironmentInfo {
            splits: vec![
                split(TRAIN_SPLIT, TRAIN),
                split(HELD_OUT_SPLIT, self.held_out),
            ]
            .into(),
            components: vec![RString::from("correct")].into(),
            sources: RVec::new(),
            reward_min: 0.0,
            reward_max: 1.0,
            multi_turn: false,
        })
    }

    fn item(&self, split: &str, index: u64) -> sdk::Result<EnvItem> {
        match split {
            TRAIN_SPLIT => {
                let j = index % TRAIN;
                let (prompt, answer) = self.problem(0, j);
                let id = if BUG == DUPLICATE_IDS { j / 2 } else { j };
                Ok(EnvItem::text(
                    format!("train-{id}"),
                    prompt,
                    answer.to_string(),
                ))
            }
            HELD_OUT_SPLIT => self.held_out_item(index),
            other => Err(PluginError::invalid_input(format!("no split `{other}`"))),
        }
    }

    fn score(&self, samples: Vec<ScoreSample>) -> sdk::Result<Vec<Reward>> {
        let mut rewards: Vec<Reward> = samples
            .iter()
            .map(|s| {
                let text = s.completion.text.as_str();
                if BUG == PANICS_IN_SCORE && text.len() > 100_000 {
                    panic!("toy environment: completion too long");
                }
                if text.trim().is_empty() {
                    let why = if BUG == SILENT_FAILURE {
                        ""
                    } else {
                        "empty completion"
                    };
                    return Reward::failed(why);
                }
                let right =
                    last_integer(text).map(|n| n.to_string()) == Some(s.item.answer.to_string());
                let value = match (right, BUG) {
                    (true, OUT_OF_RANGE) => 2.0,
                    (true, _) => 1.0,
                    (false, _) => 0.0,
                };
                let r = Reward::ok(value).with_component("correct", f64::from(value));
                if BUG == UNDECLARED_COMPONENT {
                    r.with_component("bonus", 0.0)
                } else {
                    r
                }
            })
            .collect();
        if BUG == WRONG_COUNT {
            rewards.pop();
        }
        if BUG == ORDER_DEPENDENT && !rewards.is_empty() {
            rewards.rotate_left(1);
        }
        Ok(rewards)
    }
}

struct Toy<const BUG: u8>;

impl<const BUG: u8> Plugin for Toy<BUG> {
    fn manifest() -> PluginManifest {
        sdk::manifest("toy-env", "0.1.0", Vec::new())
    }

    fn environments() -> Vec<EnvironmentDecl> {
        vec![EnvironmentDecl {
            name: "toy".into(),
            description: "fixture".into(),
        }]
    }

    fn new_environment(config: EnvironmentConfig, _: HostBox) -> sdk::Result<EnvironmentBox> {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        Ok(sdk::environment_box(ToyEnv::<BUG> {
            seed: config.seed,
            held_out: u64::from(config.held_out),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
        }))
    }
}

fn setup<const BUG: u8>() -> EnvironmentSetup {
    EnvironmentSetup::new(Source::Module(sdk::module_of::<Toy<BUG>>()), "toy")
        .seed(7)
        .held_out(8)
}

/// The failures of every check on the fixture of kind `BUG`, as (check, rule).
fn broken<const BUG: u8>() -> Vec<(&'static str, &'static str)> {
    failures(&setup::<BUG>())
        .into_iter()
        .map(|(check, f)| (check, f.rule))
        .collect()
}

#[test]
fn a_correct_environment_passes() {
    assert_eq!(failures(&setup::<CORRECT>()), vec![]);
    // Without a held-out split, too.
    assert_eq!(failures(&setup::<CORRECT>().held_out(0)), vec![]);
}

#[test]
fn an_undeclared_component_is_caught_by_every_check() {
    let s = EnvironmentSetup::new(Source::Module(sdk::module_of::<Toy<CORRECT>>()), "nope");
    let got = failures(&s);
    assert_eq!(got.len(), crate::environment::ALL.len(), "{got:?}");
    assert!(
        got.iter()
            .all(|(_, f)| f.rule == "the component is declared"
                && f.detail.contains("no environment `nope`")),
        "{got:?}"
    );
}

/// (check, rule) pairs.
type Rules = Vec<(&'static str, &'static str)>;

/// Each broken fixture fails exactly the checks, and the rule, it breaks.
#[test]
fn each_broken_environment_fails_its_rule() {
    let cases: Vec<(&str, Rules, Rules)> = vec![
        (
            "nondeterministic",
            broken::<NONDETERMINISTIC>(),
            vec![("items_are_deterministic", DETERMINISTIC)],
        ),
        (
            "duplicate ids",
            broken::<DUPLICATE_IDS>(),
            vec![("ids_are_unique", UNIQUE_IDS)],
        ),
        (
            "held-out leak",
            broken::<HELD_OUT_LEAK>(),
            vec![("held_out_is_not_in_train", NO_LEAK)],
        ),
        (
            "held-out wraps",
            broken::<HELD_OUT_WRAPS>(),
            vec![("past_the_end", PAST_END)],
        ),
        (
            "panics past the end",
            broken::<PANICS_PAST_END>(),
            vec![("past_the_end", NO_PANIC)],
        ),
        (
            "out of range",
            broken::<OUT_OF_RANGE>(),
            vec![("rewards_are_valid", VALID_REWARDS)],
        ),
        (
            "wrong count",
            broken::<WRONG_COUNT>(),
            vec![
                ("one_reward_per_sample_in_order", ONE_PER_SAMPLE),
                ("rewards_are_valid", ONE_PER_SAMPLE),
                ("odd_completions_are_scored", ONE_PER_SAMPLE),
            ],
        ),
        (
            "order dependent",
            broken::<ORDER_DEPENDENT>(),
            vec![("one_reward_per_sample_in_order", ONE_PER_SAMPLE)],
        ),
        (
            "silent failure",
            broken::<SILENT_FAILURE>(),
            vec![("odd_completions_are_scored", FAILURE_REASON)],
        ),
        (
            "undeclared component",
            broken::<UNDECLARED_COMPONENT>(),
            vec![
                ("rewards_are_valid", VALID_REWARDS),
                ("odd_completions_are_scored", VALID_REWARDS),
            ],
        ),
        (
            "panics in score",
            broken::<PANICS_IN_SCORE>(),
            vec![("odd_completions_are_scored", NO_PANIC)],
        ),
    ];
    for (bug, got, want) in cases {
        assert_eq!(got, want, "{bug}");
    }
}

/// The failures say what is wrong in a line a plugin author can act on.
#[test]
fn failures_name_the_item_or_sample() {
    let detail = |s: EnvironmentSetup, check: &str| {
        failures(&s)
            .into_iter()
            .find(|(c, _)| *c == check)
            .map(|(_, f)| f.to_string())
            .unwrap()
    };
    let d = detail(setup::<DUPLICATE_IDS>(), "ids_are_unique");
    assert!(
        d.contains("items 0 and 1 of `train` both have id `train-0`"),
        "{d}"
    );
    let d = detail(setup::<OUT_OF_RANGE>(), "rewards_are_valid");
    assert!(
        d.contains("item `train-0`") && d.contains("reward 2 is outside [0, 1]"),
        "{d}"
    );
    let d = detail(setup::<PANICS_IN_SCORE>(), "odd_completions_are_scored");
    assert!(
        d.contains("panicked") && d.contains("completion too long") && d.contains("sample 4 "),
        "{d}"
    );
    let d = detail(setup::<HELD_OUT_LEAK>(), "held_out_is_not_in_train");
    assert!(
        d.contains("held-out item `held_out-0` has the prompt of training item `train-0`"),
        "{d}"
    );
}
