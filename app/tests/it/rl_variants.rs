//! The GRPO variants of `[algorithm]` through `tandem run`: DAPO's dynamic sampling with
//! Dr. GRPO's unscaled advantages and constant-length loss (the trainer's
//! `train_step_policy`) and the KL in the reward — the rounds, kept and dropped
//! groups each step reports, every sample of every round in `rollouts.jsonl`, the `ref`
//! logprobs scored before the batch — and the same run again, stopped half-way and
//! resumed, step for step equal (the data position counts every prompt sampled).

#![allow(clippy::unwrap_used)]

use crate::common::rl::*;

const PROMPTS: u64 = 4;
/// Pairs: a group drops with probability p² + (1 − p)² ≥ 1/2 whatever the accuracy p, so
/// some of the run's 8+ groups drop on any machine.
const GROUP: u64 = 2;
const ROUNDS: u64 = 3;

/// The figures of a run's steps that must repeat exactly.
fn figures(metrics: &[serde_json::Value]) -> Vec<String> {
    metrics
        .iter()
        .map(|m| {
            format!(
                "{} {} {} {} {} {}",
                m["step"],
                m["reward_mean"],
                m["sampling_rounds"],
                m["groups_kept"],
                m["groups_dropped"],
                m["train_sequences"]
            )
        })
        .collect()
}

#[test]
fn dynamic_sampling_with_kl_in_the_reward_reports_its_rounds_and_resumes_exactly() {
    let t = Scratch::warm();
    let job = t.job(&JobOpts {
        steps: 4,
        save_every: 2,
        prompts: PROMPTS as u32,
        group: GROUP as u32,
        extra_run: "dump_rollouts = true\n".into(),
        extra_algorithm: format!(
            "kl_coef = 0.05\nkl_in = \"reward\"\nkl_estimator = \"k1\"\nscale_rewards = \"none\"\n\
             loss_agg = \"dr-grpo\"\n\
             dynamic_sampling = true\nmax_sampling_rounds = {ROUNDS}\n"
        ),
        // Exact match only: whole groups of the warm-started model miss, so groups drop.
        task_options: "max_operand = 3\nreward = \"exact\"\n".into(),
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let metrics = t.metrics();
    assert_eq!(steps_of(&metrics), [1, 2, 3, 4]);
    let mut generated = 0;
    for m in &metrics {
        let rounds = m["sampling_rounds"].as_u64().unwrap();
        let kept = m["groups_kept"].as_u64().unwrap();
        let dropped = m["groups_dropped"].as_u64().unwrap();
        assert!((1..=ROUNDS).contains(&rounds), "{m}");
        assert!(kept <= PROMPTS, "{m}");
        // Another round only for want of groups with signal; the last one when the rounds
        // are spent or the groups are there.
        assert!(kept + dropped >= PROMPTS, "{m}");
        assert!(rounds == 1 || dropped > 0, "{m}");
        assert!(rounds == ROUNDS || kept == PROMPTS, "{m}");
        assert!(
            m["train_sequences"].as_u64().unwrap() <= kept * GROUP,
            "{m}"
        );
        generated += (kept + dropped) * GROUP;
    }
    let of = |key: &'static str| metrics.iter().map(move |m| m[key].as_u64().unwrap());
    assert!(of("groups_dropped").sum::<u64>() > 0);
    assert!(of("sampling_rounds").max() > Some(1));
    assert!(of("groups_kept").sum::<u64>() > 0);
    // Every sample of every round is in the dump.
    let dumped = std::fs::read_to_string(t.dir.join("run/rollouts.jsonl")).unwrap();
    assert_eq!(dumped.lines().count() as u64, generated);
    // The reference scored every step's samples for the rewards, and only for them.
    let events = t.events();
    let refs: Vec<&str> = events
        .iter()
        .filter(|e| e["op"] == "ref_logprobs")
        .map(|e| e["detail"].as_str().unwrap())
        .collect();
    assert_eq!(refs, ["reward"; 4]);

    // The same job stopped after step 2 and resumed from its checkpoint: the same steps.
    let halted = t.run(&job, &["--output-dir", "run2", "--steps", "2"]);
    assert!(halted.status.success(), "{}", halted.stderr_text());
    let resumed = t.tandem(&["run", "--resume", "run2", "--steps", "4"]);
    assert!(resumed.status.success(), "{}", resumed.stderr_text());
    let again = std::fs::read_to_string(t.dir.join("run2/metrics.jsonl")).unwrap();
    let again: Vec<serde_json::Value> = again
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(figures(&again), figures(&metrics));
}
