//! Asynchronous RL (`[algorithm] max_staleness = k`) through `tandem run`: the engines
//! generate the next step's rollout while the trainer trains; every trained sample is at most
//! k versions old (read from the dumped train batches), every prompt trains once — the same
//! prompts, step by step, as the synchronous run — across a trainer's death, its restart and
//! a `--resume`; and `tandem check` refuses what cannot honour the bound, in one line.

use crate::common::rl::{JobOpts, OutputText, Scratch, json_lines, tandem_bin};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output};

const STEPS: u32 = 5;

/// A disaggregated job of `STEPS` steps at `max_staleness = k` that dumps its train batches.
fn job(t: &Scratch, k: u32, bridge: &str, save_every: u32, extra_run: &str) -> std::path::PathBuf {
    t.job(&JobOpts {
        steps: STEPS,
        save_every,
        placement: "disaggregated".into(),
        bridge: bridge.into(),
        extra_run: format!("dump_rollouts = true\n{extra_run}"),
        extra_algorithm: format!("max_staleness = {k}\n"),
        ..JobOpts::default()
    })
}

/// `tandem run JOB` with `TANDEM_CHAOS` set to `chaos` (unset when empty).
fn run_with_chaos(t: &Scratch, args: &[&str], chaos: &str) -> Output {
    let mut c = Command::new(tandem_bin());
    c.args(args).current_dir(&t.dir).env_remove("TANDEM_CHAOS");
    if !chaos.is_empty() {
        c.env("TANDEM_CHAOS", chaos);
    }
    c.output().unwrap()
}

/// The problem ids each step trained: its last `items` event (a step run again after a
/// resume or a recovery records them again).
fn items_by_step(t: &Scratch) -> BTreeMap<u64, Vec<String>> {
    t.events()
        .iter()
        .filter(|e| e["op"] == "items")
        .map(|e| {
            let ids = e["detail"].as_str().unwrap().split(' ');
            (
                e["step"].as_u64().unwrap(),
                ids.map(str::to_owned).collect(),
            )
        })
        .collect()
}

/// No problem id trains in two steps, and every step up to `steps` trained.
fn assert_each_once(items: &BTreeMap<u64, Vec<String>>, steps: u64) {
    assert_eq!(
        items.keys().copied().collect::<Vec<_>>(),
        (1..=steps).collect::<Vec<_>>()
    );
    let all: Vec<&String> = items.values().flatten().collect();
    let unique: BTreeSet<&String> = all.iter().copied().collect();
    assert_eq!(
        all.len(),
        unique.len(),
        "a problem trained twice: {items:?}"
    );
}

/// Every sample of `rollouts.jsonl` within `k` versions of the weights it trained; the
/// most stale one's age.
fn max_staleness(t: &Scratch, k: u64) -> u64 {
    let lines = json_lines(&t.dir.join("run/rollouts.jsonl"));
    assert!(!lines.is_empty());
    let mut most = 0;
    for l in &lines {
        let (made, trained) = (
            l["policy_version"].as_u64().unwrap(),
            l["trained_version"].as_u64().unwrap(),
        );
        assert!(made <= trained && trained - made <= k, "k = {k}: {l}");
        most = most.max(trained - made);
    }
    most
}

/// The steps that synced, and those the schedule says: the trainer's version after each
/// step (its `train` events) against the engines', a sync once the engines are `k` versions
/// behind — or behind at all at the last step.
fn syncs(events: &[serde_json::Value], k: u64) -> (Vec<u64>, Vec<u64>) {
    let version = |e: &serde_json::Value| {
        let d = e["detail"].as_str().unwrap();
        d.strip_prefix("version ").unwrap().parse::<u64>().unwrap()
    };
    let init = events
        .iter()
        .find(|e| e["op"] == "init")
        .map(version)
        .unwrap();
    let (mut served, mut trained, mut want) = (init, init, Vec::new());
    for step in 1..=u64::from(STEPS) {
        let of_step = |op: &str| {
            events
                .iter()
                .filter(move |e| e["step"].as_u64() == Some(step) && e["op"] == op)
                .count()
        };
        if of_step("train") > 0 {
            trained += 1;
        }
        let k = if step == u64::from(STEPS) { 0 } else { k };
        if served < trained && (k == 0 || served + k <= trained) {
            served = trained;
            want.push(step);
        }
    }
    let done = events
        .iter()
        .filter(|e| e["op"] == "sync" && e["step"].as_u64() > Some(0))
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    (done, want)
}

/// The synchronous run's problem ids per step (the reference).
fn synchronous_items() -> BTreeMap<u64, Vec<String>> {
    let t = Scratch::warm();
    let out = t.run(&job(&t, 0, "broadcast", 0, ""), &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert_eq!(max_staleness(&t, 0), 0);
    items_by_step(&t)
}

#[test]
fn async_runs_train_each_prompt_once_within_their_bound() {
    let reference = synchronous_items();
    assert_each_once(&reference, u64::from(STEPS));
    for (k, bridge) in [(1u32, "broadcast"), (2, "checkpoint")] {
        let t = Scratch::warm();
        let out = t.run(&job(&t, k, bridge, 0, ""), &[]);
        assert!(out.status.success(), "k = {k}: {}", out.stderr_text());
        // The same prompts, step by step, as the synchronous run.
        assert_eq!(items_by_step(&t), reference, "k = {k}");
        // Generated ahead, so older than the weights it trains: never past the bound.
        assert!(
            max_staleness(&t, u64::from(k)) >= 1,
            "k = {k}: nothing stale"
        );
        let events = t.events();
        let ahead = events.iter().filter(|e| e["op"] == "ahead").count();
        assert_eq!(
            ahead,
            STEPS as usize - 1,
            "k = {k}: one rollout ahead per step"
        );
        let (syncs, want) = syncs(&events, u64::from(k));
        assert_eq!(syncs, want, "k = {k}");
        if k == 2 {
            assert!(syncs.len() < STEPS as usize, "k = 2 syncs less: {syncs:?}");
        }
        for m in t.metrics() {
            assert_eq!(m["stale_dropped"], 0, "{m}");
            // The correction (tis by default) weighs every trained batch.
            if m["train_sequences"].as_u64() > Some(0) {
                let w = m["is_weight_mean"].as_f64().unwrap();
                assert!(w.is_finite() && w > 0.0, "{m}");
                assert!(m["is_clipped_frac"].as_f64().is_some(), "{m}");
            }
            if m["step"].as_u64() > Some(1) {
                assert!(m["ahead_s"].as_f64().unwrap() > 0.0, "{m}");
            }
        }
    }
}

/// A trainer killed while the rollout ahead runs, without restarts: the run stops; `--resume`
/// generates the rollout that was in flight again from its problems, and every step trains
/// the synchronous run's prompts, none twice. With restarts, a dead trainer or a dead engine
/// (its rollout ahead lost) costs the run nothing. A controller SIGKILLed mid-run resumes to
/// the same prompts too.
#[test]
fn an_async_run_loses_no_prompt_to_a_death_or_a_resume() {
    let reference = synchronous_items();
    let kill = "seed=3,every=3,victim=trainer,at=train";

    let t = Scratch::warm();
    let job_path = job(&t, 1, "broadcast", 2, "max_restarts = 0\n");
    let job_arg = job_path.to_str().unwrap();
    let out = run_with_chaos(&t, &["run", job_arg], kill);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr_text());
    let out = run_with_chaos(&t, &["run", "--resume", "run"], "");
    assert!(out.status.success(), "{}", out.stderr_text());
    assert_eq!(items_by_step(&t), reference, "after --resume");
    max_staleness(&t, 1);

    let t = Scratch::warm();
    let job_path = job(&t, 1, "broadcast", 0, "");
    let out = run_with_chaos(&t, &["run", job_path.to_str().unwrap()], kill);
    assert!(out.status.success(), "{}", out.stderr_text());
    let events = t.events();
    for op in ["death", "recovered"] {
        assert!(events.iter().any(|e| e["op"] == op), "no `{op}` event");
    }
    assert_eq!(items_by_step(&t), reference, "with a restart");
    max_staleness(&t, 1);

    // The engine dies while it generates the next step's rollout.
    let t = Scratch::warm();
    let job_path = job(&t, 1, "broadcast", 0, "");
    let kill = "seed=3,every=3,victim=engine,at=train";
    let out = run_with_chaos(&t, &["run", job_path.to_str().unwrap()], kill);
    assert!(out.status.success(), "{}", out.stderr_text());
    let events = t.events();
    assert!(events.iter().any(|e| e["op"] == "death"), "no death");
    assert_eq!(items_by_step(&t), reference, "with an engine's death");
    max_staleness(&t, 1);

    controller_killed_mid_run(&reference);
}

/// A long run SIGKILLed once its step-4 checkpoint is on disk, then `--resume`d two steps past
/// its newest checkpoint: every step's prompts once, the synchronous run's where both ran.
fn controller_killed_mid_run(reference: &BTreeMap<u64, Vec<String>>) {
    use crate::common::rl::{kill_controller, newest_checkpoint, wait_for};
    use std::time::Duration;
    let t = Scratch::warm();
    let job_path = t.job(&JobOpts {
        steps: 200,
        save_every: 2,
        placement: "disaggregated".into(),
        bridge: "broadcast".into(),
        extra_algorithm: "max_staleness = 1\n".into(),
        ..JobOpts::default()
    });
    let mut child = t.spawn(&job_path, &[]);
    let run_dir = t.dir.join("run");
    let ck = run_dir.join("checkpoints/step-000004/tandem_loop_state.json");
    wait_for(Duration::from_secs(180), || ck.is_file());
    kill_controller(&mut child, &run_dir, &[("engine", 0), ("trainer", 0)]);
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(newest_checkpoint(&run_dir).join("tandem_loop_state.json"))
            .unwrap(),
    )
    .unwrap();
    let resumed_to = state["step"].as_u64().unwrap() + 2;
    let out = t.tandem(&["run", "--resume", "run", "--steps", &resumed_to.to_string()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let items = items_by_step(&t);
    assert_each_once(&items, resumed_to);
    for (step, ids) in reference {
        assert_eq!(&items[step], ids, "step {step} after a controller kill");
    }
}

#[test]
fn check_refuses_what_cannot_honour_the_bound_in_one_line() {
    let t = Scratch::new();
    for (opts, key, says) in [
        (
            JobOpts {
                extra_algorithm: "max_staleness = 1\n".into(),
                ..JobOpts::default()
            },
            "algorithm.max_staleness",
            "placement `colocate`",
        ),
        (
            JobOpts {
                placement: "disaggregated".into(),
                extra_algorithm: "max_staleness = 1\nname = \"ppo\"\n".into(),
                extra_sections: "[critic]\nplugin = \"native\"\n".into(),
                ..JobOpts::default()
            },
            "algorithm.max_staleness",
            "GRPO only",
        ),
        (
            JobOpts {
                placement: "disaggregated".into(),
                bridge: "ipc".into(),
                extra_algorithm: "max_staleness = 1\n".into(),
                ..JobOpts::default()
            },
            "bridge.plugin",
            "serve the trainer's weights in place",
        ),
        (
            JobOpts {
                placement: "disaggregated".into(),
                extra_algorithm: "max_staleness = 1\nis_cap = 0.5\n".into(),
                ..JobOpts::default()
            },
            "algorithm.is_cap",
            "must be a number >= 1",
        ),
    ] {
        let job = t.job(&opts);
        let out = t.tandem(&["check", job.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", out.stderr_text());
        let err = out.stderr_text();
        let line = err
            .lines()
            .find(|l| l.contains(says))
            .unwrap_or_else(|| panic!("no `{says}` in: {err}"));
        assert!(line.contains(key), "{line}");
    }
}
