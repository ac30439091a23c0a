//! The Python pool with a real interpreter (`$TANDEM_PYTHON`, else `python3`): every way a
//! reward can fail (sleeps forever, raises, NaN, out of range, a list of the wrong length,
//! `os._exit`, SIGKILL, a memory or CPU limit) gives failed samples with the reason, and the
//! next call on the same pool succeeds; verl's and TRL's signatures, an async reward, work
//! split over two workers. The only timeout any test hits is a 2 s one, by a function that
//! never returns.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use common::{REWARDS, ok, reasons, sample, start};
use tandem_plugin_api::{Reward, RewardStatus};
use tandem_plugin_envs::python::{Kind, PoolOptions};

/// Scores `texts` (item answer "1") with `function` on one worker.
fn one_worker(function: &str, timeout_s: f64) -> tandem_plugin_envs::python::PythonReward {
    let options = PoolOptions {
        workers: 1,
        timeout_s,
        ..PoolOptions::default()
    };
    start(function, &options, REWARDS)
}

fn texts(texts: &[&str]) -> Vec<tandem_plugin_api::ScoreSample> {
    texts.iter().map(|t| sample(t, "1")).collect()
}

/// A failure case of `rewards:controlled`: `["ok", bad, "ok"]` then `["ok"]` on one worker.
/// Returns the bad sample's reward (the others must be ok) and the pool's restarts.
fn case(bad: &str, timeout_s: f64) -> (Reward, u64, bool) {
    let r = one_worker("rewards:controlled", timeout_s);
    let pool = r.pool().unwrap();
    let pid_before = pool.pids()[0];
    let out = r.score(&texts(&["ok", bad, "ok"]));
    assert_eq!(out.len(), 3);
    assert_eq!(ok(&out[0]), 1.0, "{:?}", out[0]);
    assert_eq!(
        ok(&out[2]),
        1.0,
        "the sample after `{bad}` is scored: {:?}",
        out[2]
    );
    let next = r.score(&texts(&["ok"]));
    assert_eq!(
        ok(&next[0]),
        1.0,
        "the next call after `{bad}`: {:?}",
        next[0]
    );
    let replaced = pool.pids()[0] != pid_before;
    (out[1].clone(), pool.restarts(), replaced)
}

fn assert_failed(r: &Reward, needle: &str) {
    assert_eq!(r.status, RewardStatus::Failed, "{r:?}");
    assert!(
        r.reason.contains(needle),
        "reason `{}` lacks `{needle}`",
        r.reason
    );
}

#[test]
fn a_reward_that_sleeps_forever_times_out_and_its_worker_is_replaced() {
    let (bad, restarts, replaced) = case("sleep", 2.0);
    assert_failed(&bad, "timed out after 2s");
    assert_eq!(restarts, 1);
    assert!(replaced);
}

#[test]
fn a_reward_that_hangs_on_every_sample_costs_two_timeouts_per_chunk_not_one_per_sample() {
    let r = one_worker("rewards:controlled", 2.0);
    let out = r.score(&texts(&["sleep", "sleep", "sleep", "ok"]));
    assert_eq!(reasons(&out).len(), 4, "{out:?}");
    for o in &out {
        assert_failed(o, "timed out after 2s");
    }
    assert_eq!(
        r.pool().unwrap().restarts(),
        1,
        "the second worker is replaced at the next call"
    );
    assert_eq!(ok(&r.score(&texts(&["ok"]))[0]), 1.0);
    assert_eq!(r.pool().unwrap().restarts(), 2);
}

#[test]
fn a_reward_that_raises_fails_its_sample_with_the_exception() {
    let (bad, restarts, replaced) = case("raise", 30.0);
    assert_failed(&bad, "raised ValueError: boom");
    assert_eq!((restarts, replaced), (0, false), "a raise keeps the worker");
}

#[test]
fn a_nan_or_an_infinity_is_a_failed_sample() {
    let (bad, ..) = case("nan", 30.0);
    assert_failed(&bad, "returned nan");
    let (bad, ..) = case("inf", 30.0);
    assert_failed(&bad, "returned inf");
}

#[test]
fn a_value_out_of_the_declared_range_is_a_failed_sample_unless_declared() {
    let (bad, ..) = case("big", 30.0);
    assert_failed(&bad, "returned 7, outside the declared reward range [0, 1]");
    let options = PoolOptions {
        workers: 1,
        reward_range: Some([0.0, 10.0]),
        ..PoolOptions::default()
    };
    let r = start("rewards:controlled", &options, REWARDS);
    assert_eq!(ok(&r.score(&texts(&["big"]))[0]), 7.0);
}

#[test]
fn a_reward_that_prints_to_stdout_leaves_the_protocol_alone() {
    let r = one_worker("rewards:controlled", 30.0);
    let out = r.score(&texts(&["print", "ok"]));
    assert_eq!((ok(&out[0]), ok(&out[1])), (0.5, 1.0));
    assert_eq!(r.pool().unwrap().restarts(), 0);
}

#[test]
fn none_is_not_applicable() {
    let (bad, ..) = case("none", 30.0);
    assert_eq!(bad.status, RewardStatus::NotApplicable, "{bad:?}");
}

#[test]
fn a_worker_that_exits_fails_its_sample_with_the_exit_status_and_is_replaced() {
    let (bad, restarts, replaced) = case("exit", 30.0);
    assert_failed(&bad, "died (exit status: 3)");
    assert!(restarts >= 1 && replaced, "{restarts} {replaced}");
}

#[test]
fn a_worker_killed_by_a_signal_fails_its_sample_and_is_replaced() {
    let (bad, restarts, replaced) = case("kill", 30.0);
    assert_failed(&bad, "died (signal: 9 (SIGKILL)");
    assert!(restarts >= 1 && replaced, "{restarts} {replaced}");
}

#[test]
fn a_list_of_the_wrong_length_fails_every_sample_of_the_call() {
    let r = one_worker("rewards:trl_exact", 30.0);
    assert_eq!(r.pool().unwrap().kind(), Kind::Trl);
    let out = r.score(&texts(&["1", "short", "1"]));
    assert_eq!(reasons(&out).len(), 3);
    for o in &out {
        assert_failed(o, "returned a list of 2 rewards for 3 completions");
    }
    let next = r.score(&texts(&["1", "2"]));
    assert_eq!((ok(&next[0]), ok(&next[1])), (1.0, 0.0));
}

#[test]
fn a_memory_limit_turns_a_huge_allocation_into_a_failed_sample() {
    let options = PoolOptions {
        workers: 1,
        memory_mb: Some(1024),
        ..PoolOptions::default()
    };
    let r = start("rewards:controlled", &options, REWARDS);
    let out = r.score(&texts(&["hog", "ok"]));
    assert_failed(&out[0], "MemoryError");
    assert_eq!(ok(&out[1]), 1.0);
}

#[test]
fn a_cpu_limit_stops_a_call_that_spins() {
    let options = PoolOptions {
        workers: 1,
        cpu_s: Some(1),
        ..PoolOptions::default()
    };
    let r = start("rewards:controlled", &options, REWARDS);
    let out = r.score(&texts(&["spin", "ok"]));
    assert_failed(&out[0], "more than 1 s of CPU time");
    assert_eq!(ok(&out[1]), 1.0);
}

#[test]
fn a_verl_signature_reward_scores_each_sample_with_its_components() {
    let r = one_worker("rewards:verl_exact", 30.0);
    assert_eq!(r.pool().unwrap().kind(), Kind::Verl);
    let out = r.score(&[sample("42", "42"), sample("41", "42")]);
    assert_eq!((ok(&out[0]), ok(&out[1])), (1.0, 0.0));
    let c = &out[0].components[0];
    assert_eq!((c.name.as_str(), c.value), ("source_is_math", 1.0));
}

#[test]
fn a_trl_signature_reward_gets_columns_and_completion_ids() {
    let r = one_worker("rewards:trl_exact", 30.0);
    let out = r.score(&[sample("7", "7"), sample("8", "7")]);
    assert_eq!((ok(&out[0]), ok(&out[1])), (1.0, 0.0));
    // trl_ids returns len(completion_ids[i]) / 8 plus the metadata column `weight`.
    let r = one_worker("rewards:trl_ids", 30.0);
    let out = r.score(&[sample("abc", "x")]);
    assert_eq!(ok(&out[0]), 0.625);
}

#[test]
fn a_trl_reward_gets_chat_prompts_and_completions_as_messages_as_in_trl() {
    let r = one_worker("rewards:trl_chat", 30.0);
    let mut s = sample("yo", "1");
    s.item.messages = vec![tandem_plugin_api::ChatMessage {
        role: "user".into(),
        content: "hi".into(),
    }]
    .into();
    assert_eq!(ok(&r.score(&[s])[0]), 1.0);
}

#[test]
fn an_async_reward_runs_on_the_workers_event_loop_and_a_raise_fails_its_sample_alone() {
    let r = one_worker("rewards:async_verl", 30.0);
    assert_eq!(r.pool().unwrap().kind(), Kind::VerlAsync);
    let out = r.score(&texts(&["1", "raise", "0"]));
    assert_eq!((ok(&out[0]), ok(&out[2])), (1.0, 0.0));
    assert_failed(&out[1], "raised ValueError: async boom");
}

#[test]
fn a_batch_is_split_over_two_workers() {
    let options = PoolOptions::default();
    let r = start("rewards:with_pid", &options, REWARDS);
    let out = r.score(&texts(&["1"; 10]));
    let mut pids: Vec<f64> = out
        .iter()
        .map(|o| {
            assert_eq!(ok(o), 1.0);
            o.components[0].value
        })
        .collect();
    pids.dedup();
    assert_eq!(
        pids.len(),
        2,
        "the first five on one worker, the last five on the other"
    );
}

#[test]
fn a_module_that_does_not_import_is_one_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let e = tandem_plugin_envs::python::PythonReward::new(
        "no_such_module_here:f",
        &PoolOptions::default(),
        dir.path(),
        &dir.path().display().to_string(),
    )
    .err()
    .unwrap();
    assert!(e.message.contains("ModuleNotFoundError"), "{e}");
    assert!(!e.help.is_empty());
    let e = tandem_plugin_envs::python::PythonReward::new(
        "rewards:not_a_reward",
        &PoolOptions::default(),
        &common::write_module(dir.path(), "rewards", REWARDS),
        &dir.path().display().to_string(),
    )
    .err()
    .unwrap();
    assert!(e.message.contains("cannot tell the signature"), "{e}");
}
