//! An RL run with `[drafter] enabled` through `tandem run` (real worker processes: two
//! engines, the policy trainer, the drafter trainer): the drafter trains in the bubbles of
//! each step's rollout in the coordinator's order, its regions hold nothing outside
//! training, the trained drafter reaches the engines, which then speculate; memory stays flat
//! over 100 steps; a drafter trainer SIGKILLed mid-bubble leaves the run going on without
//! speculation, saying so; bad `[drafter]` settings are one line each.

use crate::common::rl::{JobOpts, OutputText, Scratch};
use serde_json::Value;
use std::process::Command;

const STEPS: u64 = 4;

/// Two engines, three prompts (rank 0 has two groups, rank 1 one: rank 1 finishes first),
/// greedy on the untrained model (long completions), a drafter trained in the bubbles.
fn job(t: &Scratch) -> std::path::PathBuf {
    job_of(t, STEPS as u32, 3, 12, "temperature = 0.0")
}

fn job_of(
    t: &Scratch,
    steps: u32,
    prompts: u32,
    max_tokens: u32,
    algorithm: &str,
) -> std::path::PathBuf {
    let job = t.job(&JobOpts {
        engines: 2,
        steps,
        prompts,
        max_tokens,
        extra_algorithm: algorithm.into(),
        bridge_options: "restart = false".into(),
        extra_sections: "[drafter]\nenabled = true\nmax_steps_per_bubble = 3\n\
                         min_steps_per_bubble = 1\n\
                         learning_rate = 0.003\n\n\
                         [drafter.options]\nttt_steps = 3\nmax_tokens = 512\n"
            .into(),
        ..JobOpts::default()
    });
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &job,
        text.replace(
            "max_seq_len = 64\n",
            "max_seq_len = 64\ndraft_tokens = 3\nspeculate_below_batch = 4\n",
        ),
    )
    .unwrap();
    job
}

fn run(t: &Scratch, chaos: Option<&str>) -> std::process::Output {
    let job = job(t);
    let mut cmd = Command::new(crate::common::rl::tandem_bin());
    cmd.args(["run", job.to_str().unwrap()]).current_dir(&t.dir);
    match chaos {
        Some(c) => cmd.env("TANDEM_CHAOS", c),
        None => cmd.env_remove("TANDEM_CHAOS"),
    };
    cmd.output().unwrap()
}

fn is(e: &Value, target: &str, op: &str) -> bool {
    e["target"] == target && e["op"] == op
}

/// Positions (in the step's events) of `target`'s `op` events.
fn at(events: &[&Value], target: &str, op: &str, detail: Option<&str>) -> Vec<usize> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| is(e, target, op) && detail.is_none_or(|d| e["detail"] == d))
        .map(|(i, _)| i)
        .collect()
}

/// Whether an engine was told to continue before the rollout completed (it must not be).
fn resumed_before(ev: &[&Value], completed: usize) -> bool {
    ev[..completed].iter().any(|e| e["op"] == "continue")
}

#[test]
fn the_drafter_trains_in_the_bubbles_in_order_and_reaches_the_engines() {
    let t = Scratch::new();
    let out = run(&t, None);
    assert!(out.status.success(), "{}", out.stderr_text());
    let events = t.events();
    for step in 1..=STEPS {
        let ev: Vec<&Value> = events.iter().filter(|e| e["step"] == step).collect();
        // Each rank: generating → released → (training → released) → completed, and never
        // training before its own share is in.
        for rank in 0..2 {
            let name = format!("engine-{rank}");
            let states: Vec<&str> = ev
                .iter()
                .filter(|e| is(e, &name, "bubble"))
                .map(|e| e["detail"].as_str().unwrap())
                .collect();
            let legal = [
                &["generating", "released", "completed"][..],
                &[
                    "generating",
                    "released",
                    "training",
                    "released",
                    "completed",
                ][..],
            ];
            assert!(
                legal.contains(&states.as_slice()),
                "step {step} {name}: {states:?}"
            );
        }
        // The rank that finished first did so while the other still generated (rank 1 has
        // half of rank 0's rows, but which is first is the machine's to decide): the bubble
        // owes a drafter step (min_steps_per_bubble = 1).
        let first_released =
            |rank: usize| at(&ev, &format!("engine-{rank}"), "bubble", Some("released"))[0];
        let (early, late) = if first_released(1) < first_released(0) {
            (1, 0)
        } else {
            (0, 1)
        };
        let onload = at(&ev, "drafter", "onload", None);
        let trained = at(&ev, "drafter", "train", None);
        let offload = at(&ev, "drafter", "offload", None);
        assert_eq!(
            (onload.len(), trained.len(), offload.len()),
            (1, 1, 1),
            "step {step}"
        );
        let early_name = format!("engine-{early}");
        let training = at(&ev, &early_name, "bubble", Some("training"));
        let released = first_released(early);
        assert!(
            released < onload[0] && onload[0] < training[0],
            "step {step}"
        );
        // The early rank gave its KV cache back on its own before the drafter onloaded; the
        // drained offload then released the other's only.
        let drained = at(&ev, &early_name, "release", Some("kv_cache (bubble)"));
        assert_eq!(drained.len(), 1, "step {step}");
        assert!(
            released < drained[0] && drained[0] < onload[0],
            "step {step}"
        );
        let releases = |rank: usize| -> Vec<String> {
            ev.iter()
                .filter(|e| is(e, &format!("engine-{rank}"), "release"))
                .map(|e| e["detail"].as_str().unwrap().to_string())
                .collect()
        };
        let (of_late, of_early) = (releases(late), releases(early));
        assert!(
            of_late.len() == 1 && of_late[0].contains("kv_cache"),
            "step {step}: {of_late:?}"
        );
        // (`checkpoint` without restarts releases the weights too: those go in the offload.)
        assert!(
            of_early[0] == "kv_cache (bubble)" && of_early[1..].iter().all(|d| d == "weights"),
            "step {step}: {of_early:?}"
        );
        assert!(trained[0] < offload[0], "step {step}");
        // The drafter's regions go before the rollout is complete, and the policy trains
        // only after every rank is complete.
        let completed = at(&ev, "engine-0", "bubble", Some("completed"))[0]
            .max(at(&ev, "engine-1", "bubble", Some("completed"))[0]);
        assert!(offload[0] < completed, "step {step}");
        let policy = at(&ev, "trainer", "train", None);
        assert!(policy.iter().all(|&p| p > completed), "step {step}");
        assert!(!resumed_before(&ev, completed), "step {step}");
        // The trained drafter is loaded by the engines after the staged onload (greedy
        // groups carry no signal, so the policy may not train at all).
        let loaded = at(&ev, "engines", "load_drafter", None);
        let resumed = at(&ev, "engine-0", "continue", None);
        assert_eq!(loaded.len(), 1, "step {step}");
        assert!(
            loaded[0] > completed && loaded[0] > resumed[0],
            "step {step}"
        );
    }
    let metrics = t.metrics();
    assert_eq!(metrics.len(), STEPS as usize);
    for m in &metrics {
        let steps = m["drafter_steps"].as_u64().unwrap();
        assert!((1..=3).contains(&steps), "{m}");
        assert!(m["drafter_loss"].as_f64().unwrap().is_finite(), "{m}");
        // The drafter trainer's regions hold nothing outside training.
        assert_eq!(m["ledger"]["drafter"], 0, "{m}");
        assert!(m["rss"]["drafter"].as_u64().unwrap() > 0, "{m}");
        assert_eq!(m["speculating"], true, "{m}");
        assert!(m["drafter_version"].as_u64().unwrap() >= m["step"].as_u64().unwrap());
    }
    // From step 2 on the engines speculate with the drafter of the step before.
    for m in &metrics[1..] {
        assert!(m["spec_tokens"].as_u64().unwrap() > 0, "{m}");
        let len = m["acceptance_length"].as_f64().unwrap();
        assert!((1.0..=4.0).contains(&len), "{m}");
    }
}

#[test]
fn memory_stays_flat_over_100_steps_with_the_drafter_on() {
    // As the loop's own flat-memory test (rl_loop.rs): the warm-started model, two groups of
    // four, four tokens; sampling, so the policy trains every step and the drafter follows.
    let t = Scratch::warm();
    let job = job_of(&t, 100, 2, 4, "temperature = 1.0");
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let metrics = t.metrics();
    assert_eq!(metrics.len(), 100);
    assert!(
        metrics
            .iter()
            .all(|m| m["drafter_steps"].as_u64().unwrap() >= 1),
        "every step trains the drafter"
    );
    // The ledger is exact (the drafter's is 0 outside its bubbles): step 10 against step
    // 100. Of RSS, the memory the workers allocated, within 2 % or 2 MiB (allocator arenas),
    // as for a run without one — the medians of steps 10-30 and 80-100, since one sample of
    // a heap moves by a few MB with fragmentation and load (one CI run: an engine's 38.9 MB
    // at step 10, 41.2 MB at step 100).
    for (field, floor, early, late) in [
        ("rss_data", 2.0 * 1024.0 * 1024.0, 10..=30, 80..=100),
        ("ledger", 0.0, 10..=10, 100..=100),
    ] {
        let at10 = metrics[9][field].as_object().unwrap();
        let workers: Vec<&String> = at10.keys().collect();
        assert_eq!(
            workers,
            ["drafter", "engine-0", "engine-1", "trainer"],
            "{field}"
        );
        for worker in at10.keys() {
            let (was, now) = (
                crate::common::rl::median_of(&metrics, field, worker, early.clone()),
                crate::common::rl::median_of(&metrics, field, worker, late.clone()),
            );
            assert!(
                (now - was).abs() <= (0.02 * was).max(floor),
                "{field} of {worker}: {was} bytes over steps {early:?}, {now} over {late:?}"
            );
        }
    }
    assert!(metrics.iter().all(|m| m["ledger"]["drafter"] == 0));
}

#[test]
fn a_drafter_trainer_killed_mid_bubble_leaves_the_run_without_speculation() {
    let t = Scratch::new();
    let out = run(&t, Some("drafter=2"));
    assert!(out.status.success(), "{}", out.stderr_text());
    let err = out.stderr_text();
    assert!(
        err.contains("the drafter is off for the rest of the run")
            && err.contains("continues without speculative decoding"),
        "{err}"
    );
    let events = t.events();
    let off: Vec<&Value> = events.iter().filter(|e| is(e, "drafter", "off")).collect();
    assert_eq!(off.len(), 1, "{off:?}");
    assert_eq!(off[0]["step"], 2);
    assert!(
        off[0]["detail"].as_str().unwrap().contains("died"),
        "{off:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["step"] == 2 && is(e, "engines", "load_drafter") && e["detail"] == "off"),
        "the engines were not told to stop speculating"
    );
    let metrics = t.metrics();
    assert_eq!(
        metrics.len(),
        STEPS as usize,
        "the run went on to its last step"
    );
    for m in &metrics[2..] {
        assert_eq!(m["speculating"], false, "{m}");
        assert!(m.get("drafter_steps").is_none(), "{m}");
        assert_eq!(m["spec_tokens"].as_u64().unwrap_or(0), 0, "{m}");
    }
}

#[test]
fn bad_drafter_settings_of_an_rl_job_are_one_line_each() {
    let t = Scratch::new();
    let base = std::fs::read_to_string(job(&t)).unwrap();
    for (from, to, want) in [
        (
            "max_steps_per_bubble = 3",
            "max_steps_per_bubble = 3\nmin_ranks_for_training = 3",
            "drafter.min_ranks_for_training: 3 ranks must finish",
        ),
        (
            "max_steps_per_bubble = 3",
            "max_steps_per_bubble = 0",
            "drafter.max_steps_per_bubble: must be at least 1",
        ),
        (
            "min_steps_per_bubble = 1",
            "min_steps_per_bubble = 4",
            "drafter.min_steps_per_bubble: 4 is above max_steps_per_bubble = 3",
        ),
        (
            "enabled = true",
            "enabled = true\nplugin = \"native\"",
            "does not declare that it can train a drafter",
        ),
        (
            "ttt_steps = 3",
            "ttt_steps = 0",
            "drafter.options.ttt_steps",
        ),
        (
            "learning_rate = 0.003",
            "learning_rate = 0.003\nspeculate_below_batch = 2",
            "drafter.speculate_below_batch: is an option of the engine",
        ),
        (
            "max_steps_per_bubble = 3",
            "max_steps_per_bubble = 3\nmin_acceptance = -1.0",
            "drafter.min_acceptance: must be >= 0",
        ),
    ] {
        let path = t.dir.join("bad.toml");
        std::fs::write(&path, base.replace(from, to)).unwrap();
        let out = t.tandem(&["check", path.to_str().unwrap()]);
        let err = out.stderr_text();
        assert_eq!(out.status.code(), Some(2), "{to}: {err}");
        assert!(err.contains(want), "{want:?} in:\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // The good job checks, and says how its drafter trains.
    let out = t.tandem(&["check", job(&t).to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("trained in the rollout's bubbles"), "{text}");
}
