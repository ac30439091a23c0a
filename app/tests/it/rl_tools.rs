//! Multi-turn rollouts with tools (`[environment] tools`) through `tandem run`, on the tiny
//! model with a chat template of its own: every dumped turn is the engine's ids after exactly
//! what the engine saw, each trajectory's mask marks exactly its turns' ids, the step's
//! `tools` figures are written, and `tandem check` prints the tool use. (The tiny model seldom
//! writes a call; the ids between turns are checked token by token in `tandem_rl::turns`.)

use crate::common::rl::{JobOpts, OutputText, Scratch, json_lines, tandem_bin};
use std::collections::BTreeSet;

/// A chat template for the tiny model: `role:` and a line break (so no byte-level merge joins
/// a header with the text after it), the content, its EOS.
const TEMPLATE: &str = "{% for m in messages %}{{ m['role'] }}:\n{{ m['content'] }}<|endoftext|>{% endfor %}{% if add_generation_prompt %}assistant:\n{% endif %}";

fn job(t: &Scratch) -> std::path::PathBuf {
    job_with(t, 2, 1, "")
}

/// The tools job of `steps` steps on `engines` engine ranks, with `extra_run` in `[run]`.
fn job_with(t: &Scratch, steps: u32, engines: u32, extra_run: &str) -> std::path::PathBuf {
    tools_job(
        t,
        JobOpts {
            steps,
            engines,
            extra_run: format!("dump_rollouts = true\n{extra_run}"),
            ..JobOpts::default()
        },
    )
}

/// `o`'s job with the tiny model's chat template and the calculator, 3 turns at most.
fn tools_job(t: &Scratch, o: JobOpts) -> std::path::PathBuf {
    std::fs::write(t.dir.join("model/chat_template.jinja"), TEMPLATE).unwrap();
    let path = t.job(&o);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("max_seq_len = 64", "max_seq_len = 1024")
        .replace(
            "kind = \"arithmetic\"\n",
            "kind = \"arithmetic\"\nchat = true\ntools = [\"calculate\"]\ntool_format = \"hermes\"\nmax_turns = 3\n",
        );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_trained_turn_is_the_engines_ids_after_what_it_saw() {
    let t = Scratch::new();
    let job = job(&t);
    let out = t.tandem(&["check", job.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        out.stdout_text()
            .contains("tools      calculate (hermes format): up to 3 assistant turns"),
        "{}",
        out.stdout_text()
    );
    let steps = run_steps(&t, &job);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        let turns = m["tools"]["turns"].as_f64().unwrap();
        assert!((1.0..=3.0).contains(&turns), "{m}");
        assert!(m["tools"]["calls"].as_f64().is_some(), "{m}");
        let t = &m["trajectories"];
        assert_eq!(
            (t["started"].as_u64(), t["completed"].as_u64()),
            (Some(16), Some(16)),
            "{m}"
        );
        assert_eq!(
            (t["failed"].as_u64(), t["dropped"].as_u64()),
            (Some(0), Some(0)),
            "{m}"
        );
    }
    let rows = json_lines(&t.dir.join("run/rollouts.jsonl"));
    assert!(!rows.is_empty());
    let mut open: Vec<&serde_json::Value> = Vec::new();
    let mut trajectories = 0;
    for r in &rows {
        let (turn, of) = (r["turn"].as_u64().unwrap(), r["turns"].as_u64().unwrap());
        let prompt: Vec<u64> = ids(&r["prompt_tokens"]);
        if turn == 0 {
            assert!(open.is_empty(), "a trajectory left unfinished: {open:?}");
        } else {
            // Turn k saw turn k - 1's context, its ids, then what came between.
            let before = open.last().unwrap();
            let mut seen = ids(&before["prompt_tokens"]);
            seen.extend(ids(&before["tokens"]));
            assert!(
                prompt.len() > seen.len() && prompt.starts_with(&seen),
                "{r}"
            );
        }
        open.push(r);
        if turn + 1 < of {
            continue;
        }
        // The trajectory's mask marks exactly its turns' ids.
        trajectories += 1;
        let all = ids(&r["trajectory_tokens"]);
        let mask: Vec<u64> = ids(&r["mask"]);
        assert_eq!(all.len(), mask.len());
        let trained: Vec<u64> = all
            .iter()
            .zip(&mask)
            .filter(|(_, m)| **m == 1)
            .map(|(i, _)| *i)
            .collect();
        let engine: Vec<u64> = open.iter().flat_map(|o| ids(&o["tokens"])).collect();
        assert_eq!(trained, engine, "{r}");
        let first = ids(&open[0]["prompt_tokens"]);
        let mut whole = first.clone();
        whole.extend(&all);
        let mut last = prompt.clone();
        last.extend(ids(&r["tokens"]));
        assert_eq!(whole, last);
        open.clear();
    }
    assert!(open.is_empty());
    assert_eq!(trajectories, 2 * 4 * 4, "2 steps of 4 prompts x 4");
}

/// An engine SIGKILLed as step 2's rollout starts (the schedule's draw for this seed, checked
/// below so the test cannot pass without it): its share's trajectories are dropped and
/// generated again under new ids by its replacement; every step's trajectories balance
/// (started = completed + failed + dropped), and no trajectory id is dumped twice.
#[test]
fn an_engine_killed_mid_rollout_drops_its_share_and_every_step_balances() {
    let t = Scratch::new();
    let job = job_with(&t, 3, 2, "restart_backoff_secs = 0.0\nmax_restarts = 2\n");
    let out = std::process::Command::new(tandem_bin())
        .args(["run", job.to_str().unwrap()])
        .current_dir(&t.dir)
        .env("TANDEM_CHAOS", "seed=1,every=2,victim=engine,at=rollout")
        .output()
        .unwrap();
    let err = out.stderr_text();
    assert!(out.status.success(), "{err}");
    assert!(err.contains("0 ms into step 2's Rollout"), "{err}");
    let metrics = t.metrics();
    let mut dropped = Vec::new();
    for m in metrics.iter().filter(|m| m["step"].as_u64() > Some(0)) {
        let n = |k: &str| m["trajectories"][k].as_u64().unwrap();
        assert_eq!(
            n("started"),
            n("completed") + n("failed") + n("dropped"),
            "{m}"
        );
        assert_eq!(n("completed"), 16, "{m}");
        dropped.push(n("dropped"));
    }
    // Step 2: one engine's share of 2 groups x 4 lost and generated again.
    assert_eq!(dropped, [0, 8, 0]);
    let rows = json_lines(&t.dir.join("run/rollouts.jsonl"));
    let ids: BTreeSet<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["trajectory"].as_str().unwrap().to_owned(),
                r["turn"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ids.len(), rows.len(), "a trajectory's turn dumped twice");
    // The retried share's trajectories have ids past the lost ones (16 started first).
    assert!(
        ids.iter()
            .any(|(id, _)| id.starts_with("2.") && id[2..].parse::<u64>().unwrap() >= 16)
    );
}

/// Multi-turn rollouts generated ahead (`max_staleness = 1`, engine and trainer apart):
/// every step's trajectories balance and every dumped turn is within one version.
#[test]
fn tool_rollouts_generated_ahead_stay_within_the_bound() {
    let t = Scratch::new();
    let job = tools_job(
        &t,
        JobOpts {
            steps: 3,
            placement: "disaggregated".into(),
            bridge: "broadcast".into(),
            extra_run: "dump_rollouts = true\n".into(),
            extra_algorithm: "max_staleness = 1\n".into(),
            ..JobOpts::default()
        },
    );
    let steps = run_steps(&t, &job);
    assert_eq!(steps.len(), 3);
    assert!(
        steps.iter().any(|m| m["ahead_s"].as_f64().is_some()),
        "{steps:?}"
    );
    for m in steps {
        let n = |k: &str| m["trajectories"][k].as_u64().unwrap();
        assert_eq!(
            n("started"),
            n("completed") + n("failed") + n("dropped"),
            "{m}"
        );
        assert!(m["tools"]["turns"].as_f64().is_some(), "{m}");
    }
    for r in json_lines(&t.dir.join("run/rollouts.jsonl")) {
        let (made, trained) = (
            r["policy_version"].as_u64().unwrap(),
            r["trained_version"].as_u64().unwrap(),
        );
        assert!(made <= trained && trained - made <= 1, "{r}");
        assert!(r["turn"].as_u64().is_some(), "{r}");
    }
}

/// `tandem run JOB`, which must succeed; its steps' metrics lines.
fn run_steps(t: &Scratch, job: &std::path::Path) -> Vec<serde_json::Value> {
    let out = t.run(job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let metrics = t.metrics();
    metrics
        .into_iter()
        .filter(|m| m["step"].as_u64() > Some(0))
        .collect()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}
