//! The environment checks, each a plain function of an [`EnvironmentSetup`] that builds the
//! instances it needs. Every failure names the broken rule (the `const`s below, or
//! [`NO_PANIC`](super::NO_PANIC) for a panic in any call).

use super::samples::{self, Batch};
use super::{EnvironmentSetup, NO_PANIC, call};
use crate::harness::{Failure, Outcome};
use std::collections::HashMap;
use tandem_plugin_api::{
    EnvItem, EnvironmentBox, EnvironmentInfo, ErrorCode, HELD_OUT_SPLIT, RResult, RVec, TRAIN_SPLIT,
};

/// `describe` answers, the same every time, with a `train` split and a usable reward range.
pub const DESCRIBED: &str =
    "describe names a train split, a finite reward range and its components";
/// Two instances with the same seed yield the same item for the same `(split, index)`.
pub const DETERMINISTIC: &str = "items are a pure function of (seed, split, index)";
/// An id, a prompt as text or as messages (not both), metadata as a JSON object.
pub const WELL_FORMED: &str = "items are well formed";
/// No two items of a split share an id.
pub const UNIQUE_IDS: &str = "ids are unique within a split";
/// No held-out prompt is among the first training prompts.
pub const NO_LEAK: &str = "held-out prompts are not training prompts";
/// Train wraps into another epoch, held-out past its size (and an unknown split) is an error.
pub const PAST_END: &str = "past the end: train wraps, held-out is an error";
/// One reward per sample, in order: alone, in a batch or reversed, a sample scores the same.
pub const ONE_PER_SAMPLE: &str = "one reward per sample, in order";
/// `ok` rewards are finite, inside `[reward_min, reward_max]`, with the declared components.
pub const VALID_REWARDS: &str = "ok rewards are finite, in range, with the declared components";
/// A failed or not-applicable sample says why.
pub const FAILURE_REASON: &str = "a sample not scored says why";
/// `score` answers for the whole batch whatever the completions are.
pub const BATCH_SCORED: &str = "score answers for every batch (bad completions are failed samples)";
/// An empty batch scores to no rewards.
pub const EMPTY_BATCH: &str = "an empty batch scores to no rewards";

fn describe(env: &EnvironmentBox) -> Result<EnvironmentInfo, Failure> {
    call(env.describe(), DESCRIBED, "describe")
}

/// Item `index` of `split`, well formed.
fn item(
    env: &EnvironmentBox,
    split: &str,
    index: u64,
    rule: &'static str,
) -> Result<EnvItem, Failure> {
    let it = call(
        env.item(split.into(), index),
        rule,
        &format!("item({split}, {index})"),
    )?;
    well_formed(&it, split, index)?;
    Ok(it)
}

/// Items `range` of `split`.
fn items(
    env: &EnvironmentBox,
    split: &str,
    range: std::ops::Range<u64>,
    rule: &'static str,
) -> Result<Vec<EnvItem>, Failure> {
    range.map(|i| item(env, split, i, rule)).collect()
}

/// The declared size of `split` (`None` when not declared; `Some(0)`: endless).
fn size(info: &EnvironmentInfo, split: &str) -> Option<u64> {
    info.splits
        .iter()
        .find(|s| s.name.as_str() == split)
        .map(|s| s.size)
}

/// The held-out indices the checks read: all of a declared split, at most the setup's limit.
fn held_out_range(setup: &EnvironmentSetup, info: &EnvironmentInfo) -> std::ops::Range<u64> {
    0..size(info, HELD_OUT_SPLIT)
        .unwrap_or(0)
        .min(setup.held_out_limit)
}

fn well_formed(it: &EnvItem, split: &str, index: u64) -> Outcome {
    let at = format!("item({split}, {index})");
    let bad = |what: String| Err(Failure::new(WELL_FORMED, format!("{at}: {what}")));
    if it.id.trim().is_empty() {
        return bad("its id is empty".into());
    }
    match (it.prompt.is_empty(), it.messages.is_empty()) {
        (true, true) => return bad("it has neither a prompt nor messages".into()),
        (false, false) => return bad("it has both a prompt and messages (one of them)".into()),
        _ => {}
    }
    if let Some(m) = it
        .messages
        .iter()
        .find(|m| !["system", "user", "assistant", "tool"].contains(&m.role.as_str()))
    {
        return bad(format!(
            "a message has role `{}` (system, user, assistant or tool)",
            m.role
        ));
    }
    match serde_json::from_str::<serde_json::Value>(it.metadata_json.as_str()) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        _ => bad(format!(
            "its metadata is not a JSON object: {:.80}",
            it.metadata_json.as_str()
        )),
    }
}

/// Declared in the root module, built, described the same twice: a `train` split, split names
/// unique, a finite reward range with `min < max`, component names non-empty and unique.
pub fn declared_and_described(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let info = describe(&env)?;
    let again = describe(&env)?;
    let fail = |what: String| Err(Failure::new(DESCRIBED, what));
    if info != again {
        return fail(format!("describe answered {info:?}, then {again:?}"));
    }
    if size(&info, TRAIN_SPLIT).is_none() {
        return fail(format!("no `{TRAIN_SPLIT}` split among {:?}", info.splits));
    }
    if let Some(dup) = first_duplicate(info.splits.iter().map(|s| s.name.as_str())) {
        return fail(format!("split `{dup}` is listed twice"));
    }
    let (lo, hi) = (info.reward_min, info.reward_max);
    if !(lo.is_finite() && hi.is_finite() && lo < hi) {
        return fail(format!(
            "the reward range [{lo}, {hi}] must be finite with reward_min < reward_max"
        ));
    }
    if info.components.iter().any(|c| c.trim().is_empty()) {
        return fail(format!(
            "a component has an empty name: {:?}",
            info.components
        ));
    }
    if let Some(dup) = first_duplicate(info.components.iter().map(|c| c.as_str())) {
        return fail(format!("component `{dup}` is listed twice"));
    }
    Ok(())
}

fn first_duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = std::collections::HashSet::new();
    names.into_iter().find(|n| !seen.insert(*n))
}

/// Two instances built with the same configuration give the same items (ids included) for
/// training indices `0..probe` and every held-out index; reading them again in reverse order
/// changes nothing; an instance with another seed builds and gives well-formed items.
pub fn items_are_deterministic(setup: &EnvironmentSetup) -> Outcome {
    let (a, b) = (setup.build()?, setup.build()?);
    let info = describe(&a)?;
    for (split, range) in [
        (TRAIN_SPLIT, 0..setup.probe),
        (HELD_OUT_SPLIT, held_out_range(setup, &info)),
    ] {
        let first = items(&a, split, range.clone(), DETERMINISTIC)?;
        let other = items(&b, split, range.clone(), DETERMINISTIC)?;
        let reread = range
            .clone()
            .rev()
            .map(|i| item(&a, split, i, DETERMINISTIC))
            .collect::<Result<Vec<_>, _>>()?;
        for ((i, x), (y, z)) in range.zip(&first).zip(other.iter().zip(reread.iter().rev())) {
            for (what, y) in [("a second instance", y), ("a second read", z)] {
                if x != y {
                    return Err(Failure::new(
                        DETERMINISTIC,
                        format!(
                            "item({split}, {i}) differs in {what}: {} vs {}",
                            brief(x),
                            brief(y)
                        ),
                    ));
                }
            }
        }
    }
    let mut config = setup.config.clone();
    config.seed = config.seed.wrapping_add(1);
    let c = setup.build_with(config)?;
    items(&c, TRAIN_SPLIT, 0..setup.probe.min(4), DETERMINISTIC)?;
    Ok(())
}

/// An item in a line: its id and the start of its prompt.
fn brief(it: &EnvItem) -> String {
    format!("[id `{}`, prompt {:.60?}]", it.id, samples::prompt_key(it))
}

/// No two training items among `0..probe` share an id, nor two held-out items.
pub fn ids_are_unique(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let info = describe(&env)?;
    for (split, range) in [
        (TRAIN_SPLIT, 0..setup.probe),
        (HELD_OUT_SPLIT, held_out_range(setup, &info)),
    ] {
        let mut seen: HashMap<String, u64> = HashMap::new();
        for (i, it) in range.clone().zip(items(&env, split, range, UNIQUE_IDS)?) {
            if let Some(j) = seen.insert(it.id.to_string(), i) {
                return Err(Failure::new(
                    UNIQUE_IDS,
                    format!("items {j} and {i} of `{split}` both have id `{}`", it.id),
                ));
            }
        }
    }
    Ok(())
}

/// No held-out item's prompt (text or messages) is the prompt of a training item among
/// `0..probe`.
pub fn held_out_is_not_in_train(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let info = describe(&env)?;
    let train: HashMap<String, String> = items(&env, TRAIN_SPLIT, 0..setup.probe, NO_LEAK)?
        .into_iter()
        .map(|it| (samples::prompt_key(&it), it.id.to_string()))
        .collect();
    let range = held_out_range(setup, &info);
    for it in items(&env, HELD_OUT_SPLIT, range, NO_LEAK)? {
        if let Some(id) = train.get(&samples::prompt_key(&it)) {
            return Err(Failure::new(
                NO_LEAK,
                format!(
                    "held-out item `{}` has the prompt of training item `{id}`",
                    it.id
                ),
            ));
        }
    }
    Ok(())
}

/// A finite training split of `n` items gives valid items at `n`, `n + 1` and `2n + 1`
/// (another epoch), an endless one at index 2^20; reading the held-out split at its size,
/// one past it and at `u64::MAX` (at 0 when there is none), or an unknown split, is an error.
pub fn past_the_end(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let info = describe(&env)?;
    let train = match size(&info, TRAIN_SPLIT).unwrap_or(0) {
        0 => vec![1 << 20],
        n => vec![
            n,
            n.saturating_add(1),
            n.saturating_mul(2).saturating_add(1),
        ],
    };
    for i in train {
        item(&env, TRAIN_SPLIT, i, PAST_END)?;
    }
    let m = size(&info, HELD_OUT_SPLIT).unwrap_or(0);
    let mut refused = vec![
        (HELD_OUT_SPLIT, m),
        (HELD_OUT_SPLIT, m.saturating_add(1)),
        (HELD_OUT_SPLIT, u64::MAX),
    ];
    refused.push(("conformance-no-such-split", 0));
    for (split, i) in refused {
        match env.item(split.into(), i) {
            RResult::ROk(it) => {
                let why = if split == HELD_OUT_SPLIT {
                    format!("`{HELD_OUT_SPLIT}` has {m} items")
                } else {
                    "there is no such split".to_owned()
                };
                return Err(Failure::new(
                    PAST_END,
                    format!(
                        "item({split}, {i}) answered {} but {why}: it must be an error",
                        brief(&it)
                    ),
                ));
            }
            RResult::RErr(e) if e.code == ErrorCode::Panicked => {
                return Err(Failure::new(
                    NO_PANIC,
                    format!("item({split}, {i}) panicked: {}", e.message),
                ));
            }
            RResult::RErr(_) => {}
        }
    }
    Ok(())
}

/// The samples a batch check scores: training and held-out items, each with its answer and
/// with a wrong one.
fn batch(
    setup: &EnvironmentSetup,
    env: &EnvironmentBox,
    rule: &'static str,
) -> Result<Batch, Failure> {
    let info = describe(env)?;
    let mut its = items(env, TRAIN_SPLIT, 0..setup.probe.min(6), rule)?;
    let held = held_out_range(setup, &info);
    its.extend(items(
        env,
        HELD_OUT_SPLIT,
        held.start..held.end.min(3),
        rule,
    )?);
    Ok(Batch::answers(info, &its))
}

/// Scoring the batch, each sample alone, the batch reversed, and the batch on a second
/// instance gives one reward per sample each time, and the same reward for the same sample.
pub fn one_reward_per_sample_in_order(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let b = batch(setup, &env, ONE_PER_SAMPLE)?;
    let all = b.score(&env, ONE_PER_SAMPLE)?;
    let mut rev = b.reversed().score(&env, ONE_PER_SAMPLE)?;
    rev.reverse();
    let other = b.score(&setup.build()?, ONE_PER_SAMPLE)?;
    for (i, r) in all.iter().enumerate() {
        let alone = b.only(i).score(&env, ONE_PER_SAMPLE)?;
        for (how, s) in [
            ("alone", &alone[0]),
            ("in the reversed batch", &rev[i]),
            ("on a second instance", &other[i]),
        ] {
            if !samples::same(r, s) {
                return Err(Failure::new(
                    ONE_PER_SAMPLE,
                    format!(
                        "{}: {} in the batch, {} {how}",
                        b.describe(i),
                        samples::show(r),
                        samples::show(s)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Every `ok` reward of the batch is finite, in the declared range, and reports exactly the
/// declared components (finite); every other reward has a reason.
pub fn rewards_are_valid(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let b = batch(setup, &env, VALID_REWARDS)?;
    let rewards = b.score(&env, VALID_REWARDS)?;
    b.validate(&rewards)
}

/// `score` of no samples answers no rewards.
pub fn empty_batch(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let got = call(
        env.score(RVec::new()),
        EMPTY_BATCH,
        "score of an empty batch",
    )?;
    if got.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            EMPTY_BATCH,
            format!("it answered {} rewards", got.len()),
        ))
    }
}

/// Empty, blank, garbage, control-character and very long (about 200 KB) completions, some
/// unfinished with no token ids, are scored as a batch: one valid reward each (`ok` or not
/// scored with a reason), never an error for the batch.
pub fn odd_completions_are_scored(setup: &EnvironmentSetup) -> Outcome {
    let env = setup.build()?;
    let info = describe(&env)?;
    let mut its = items(&env, TRAIN_SPLIT, 0..setup.probe.min(2), BATCH_SCORED)?;
    if size(&info, HELD_OUT_SPLIT).unwrap_or(0) > 0 {
        its.push(item(&env, HELD_OUT_SPLIT, 0, BATCH_SCORED)?);
    }
    let b = Batch::odd(info, &its);
    let rewards = match b.score(&env, BATCH_SCORED) {
        Ok(r) => r,
        // Name the completion the batch fails on.
        Err(f) if f.rule == BATCH_SCORED || f.rule == NO_PANIC => {
            for i in 0..b.len() {
                b.only(i).score(&env, BATCH_SCORED).map_err(|g| {
                    Failure::new(g.rule, format!("{}: {}", b.describe(i), g.detail))
                })?;
            }
            return Err(f);
        }
        Err(f) => return Err(f),
    };
    b.validate(&rewards)
}
