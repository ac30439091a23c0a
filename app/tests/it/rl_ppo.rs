//! PPO with a critic through `tandem run` (`[algorithm] name = "ppo"`, `[critic]`): the
//! critic is a worker of its own whose memory follows the drained offload / staged onload
//! (in `events.jsonl`: it comes back after the engines released theirs, values the
//! rollout and trains before the actor, and offloads before the engines get theirs back),
//! its regions are in the ledger, each step reports its value figures, its checkpoint is
//! `critic/` inside the actor's, and a run stopped half-way and resumed repeats the same
//! steps.

#![allow(clippy::unwrap_used)]

use crate::common::rl::*;

/// The figures of a run's steps that must repeat exactly.
fn figures(metrics: &[serde_json::Value]) -> Vec<String> {
    metrics
        .iter()
        .map(|m| {
            format!(
                "{} {} {} {} {}",
                m["step"], m["reward_mean"], m["value_mean"], m["value_loss"], m["loss"]
            )
        })
        .collect()
}

fn ppo_job(t: &Scratch) -> std::path::PathBuf {
    t.job(&JobOpts {
        steps: 4,
        save_every: 2,
        bridge: "ipc".into(),
        extra_algorithm: "name = \"ppo\"\ngamma = 1.0\nlambda = 0.95\nvalue_clip = 0.2\n\
                          critic_learning_rate = 0.001\n"
            .into(),
        extra_sections: "[critic]\nplugin = \"native\"\n".into(),
        ..JobOpts::default()
    })
}

/// Index of the first event of step `step` on `target` whose op starts with `op` (after
/// `from`; the engines' onload is `resume` or, with `ipc`, `resume_kv`).
fn find(events: &[serde_json::Value], from: usize, step: u64, target: &str, op: &str) -> usize {
    events
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, e)| {
            e["step"] == step
                && e["target"] == target
                && e["op"].as_str().is_some_and(|o| o.starts_with(op))
        })
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("no {target} {op} in step {step} after event {from}"))
}

#[test]
fn ppo_trains_a_critic_whose_memory_follows_the_drained_offload_and_staged_onload() {
    let t = Scratch::warm();
    let job = ppo_job(&t);
    let check = t.tandem(&["check", job.to_str().unwrap()]);
    assert!(check.status.success(), "{}", check.stderr_text());
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(plan.contains("critic"), "{plan}");

    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let metrics = t.metrics();
    assert_eq!(steps_of(&metrics), [1, 2, 3, 4]);
    for m in &metrics {
        for key in ["value_mean", "return_mean", "value_loss", "loss"] {
            assert!(m[key].as_f64().is_some_and(f64::is_finite), "{key}: {m}");
        }
        assert!(m["ledger"]["critic"].as_u64().unwrap() > 0, "{m}");
        assert!(m["ledger"]["trainer"].as_u64().unwrap() > 0, "{m}");
    }
    // A fresh head values every state 0; the critic learns from step 1 on.
    assert_eq!(metrics[0]["value_mean"].as_f64(), Some(0.0));
    assert_ne!(metrics[3]["value_mean"].as_f64(), Some(0.0));

    let events = t.events();
    for step in 1..=4u64 {
        let released = find(&events, 0, step, "engine-0", "release");
        let onload = find(&events, 0, step, "critic", "onload");
        let values = find(&events, 0, step, "critic", "values");
        let trained = find(&events, 0, step, "critic", "train");
        let actor = find(&events, 0, step, "trainer", "train");
        let offload = find(&events, 0, step, "critic", "offload");
        let resumed = find(&events, offload, step, "engine-0", "resume");
        assert!(
            released < onload && onload < values && values < trained && trained < actor,
            "step {step}: release {released}, critic onload {onload}, values {values}, \
             critic train {trained}, actor train {actor}"
        );
        assert!(actor < offload && offload < resumed, "step {step}");
    }
    let checkpoint = t.dir.join("run/checkpoints/step-000002/critic");
    assert!(checkpoint.is_dir(), "{}", checkpoint.display());

    // Stopped after step 2 and resumed from its checkpoint (the critic's included): the
    // same steps.
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
