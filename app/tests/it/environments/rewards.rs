//! Rewards that fail, through `tandem run`: one test per way to fail. Each step's samples all
//! fail the same way; with `max_failed_frac = 1` the run goes on (both steps run, every
//! sample counted in `reward_failed` and its trajectory as failed, each named with its reason
//! in `events.jsonl`), and the
//! second step's failures come from a fresh worker (the first one's was replaced). With the
//! default `max_failed_frac` the run stops at step 1 with one line.

use super::*;

/// The Python module of the rewards, next to the job file (its directory is on the path).
const REWARDS: &str = r#"
import math, os, time

def sleeps(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(3600)

def raises(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("no answer here")

def not_a_number(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")

def too_big(data_source, solution_str, ground_truth, extra_info=None):
    return 7.0

def one_too_many(prompts, completions, **kwargs):
    return [0.5] * (len(completions) + 1)

def dies(data_source, solution_str, ground_truth, extra_info=None):
    os._exit(3)

def right(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip() == ground_truth else 0.0
"#;

/// A two-step run of `function` as the reward with `[environment] extra`; the scratch
/// directory (the run is `run/` in it) and the run's output.
fn run_with(function: &str, extra: &str) -> (Scratch, std::process::Output) {
    let t = Scratch::new();
    std::fs::write(t.dir.join("rewards.py"), REWARDS).unwrap();
    let o = JobOpts {
        steps: 2,
        prompts: 4,
        group: 2,
        ..JobOpts::default()
    };
    // Any Python 3 runs these rewards (standard library only): `$TANDEM_PYTHON` when set,
    // else `python3` from the PATH.
    let python = std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| "python3".into());
    let reward = format!(
        "{{ python = \"rewards:{function}\", workers = 1, timeout_s = 2, interpreter = \"{python}\" }}"
    );
    let job = dataset_job(&t, &o, &reward, extra);
    let out = t.run(&job, &[]);
    (t, out)
}

/// Runs `function` with every failure allowed: both steps run, all 8 samples of each fail
/// with a reason containing `reason`.
fn fails_and_goes_on(function: &str, reason: &str) {
    let (t, out) = run_with(function, "max_failed_frac = 1.0");
    assert!(out.status.success(), "{function}: {}", out.stderr_text());
    let run = t.dir.join("run");
    let steps: Vec<serde_json::Value> = json_lines(&run, "metrics.jsonl")
        .into_iter()
        .filter(|m| m["step"].as_u64().unwrap_or(0) > 0)
        .collect();
    assert_eq!(steps.len(), 2, "{function}: {steps:?}");
    for m in &steps {
        assert_eq!(m["reward_failed"], 8, "{function}: {m}");
        assert_eq!(
            m["train_sequences"], 0,
            "{function}: nothing trains on a failure: {m}"
        );
        // Every trajectory started ended failed: none lost, none completed.
        let t = &m["trajectories"];
        let n = |k: &str| t[k].as_u64();
        assert_eq!(
            (n("started"), n("failed"), n("completed"), n("dropped")),
            (Some(8), Some(8), Some(0), Some(0)),
            "{function}: {m}"
        );
    }
    let failed = env_events(&run, "reward_failed");
    assert_eq!(failed.len(), 16, "{function}: {failed:?}");
    for (step, detail) in &failed {
        assert!(
            detail.starts_with("row-"),
            "{function}: the item id first: {detail}"
        );
        assert!(detail.contains(reason), "{function} step {step}: {detail}");
    }
    assert!(
        failed.iter().any(|(s, _)| *s == 2),
        "{function}: step 2 scored again"
    );
}

#[test]
fn a_reward_that_never_returns_times_out() {
    fails_and_goes_on("sleeps", "timed out after 2s");
}

#[test]
fn a_reward_that_raises_is_a_failure_with_its_exception() {
    fails_and_goes_on("raises", "ValueError: no answer here");
}

#[test]
fn a_nan_reward_is_a_failure() {
    fails_and_goes_on("not_a_number", "returned nan");
}

#[test]
fn a_reward_out_of_range_is_a_failure() {
    fails_and_goes_on("too_big", "outside the declared reward range");
}

#[test]
fn a_list_of_the_wrong_length_fails_its_samples() {
    fails_and_goes_on(
        "one_too_many",
        "returned a list of 9 rewards for 8 completions",
    );
}

#[test]
fn a_reward_that_kills_its_worker_gets_a_new_worker() {
    fails_and_goes_on("dies", "died");
}

#[test]
fn past_max_failed_frac_the_run_stops_with_one_line() {
    let (t, out) = run_with("raises", "");
    assert!(!out.status.success());
    let errors = crate::common::error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", out.stderr_text());
    let line = &errors[0];
    assert!(
        line.contains("step 1") && line.contains("max_failed_frac"),
        "{line}"
    );
    assert!(line.contains("ValueError: no answer here"), "{line}");
    let failed = env_events(&t.dir.join("run"), "reward_failed");
    assert_eq!(failed.len(), 8, "{failed:?}");
}

#[test]
fn a_reward_that_works_trains_and_reports_per_source() {
    let (t, out) = run_with("right", "");
    assert!(out.status.success(), "{}", out.stderr_text());
    let steps = json_lines(&t.dir.join("run"), "metrics.jsonl");
    let last = steps.last().unwrap();
    assert_eq!(last["reward_failed"], 0, "{last}");
    let sources = last["reward_by_source"].as_object().unwrap();
    assert!(
        sources.keys().all(|k| k == "even" || k == "odd") && !sources.is_empty(),
        "{last}"
    );
    assert!(last["reward_s"].as_f64().unwrap() > 0.0, "{last}");
}
