//! The RL loop end to end through `tandem run`: real worker processes, the event log's
//! ordering invariants (the drained offload, the staged onload, each engine rank's rollout
//! bubble state), `needs_offload = false`, bad run directories, a killed engine and a killed
//! trainer with restarts off (`[run] max_restarts = 0`) and `--resume`, memory flatness over
//! many steps, and `[run] dump_rollouts`.

#![allow(clippy::unwrap_used)]

use crate::common::rl::*;
use std::time::{Duration, Instant};

#[test]
fn two_colocated_engines_keep_the_offload_and_onload_order() {
    // Reload in place (no restart), so every engine goes through the whole staged onload.
    staged_order("checkpoint", "restart = false");
}

#[test]
fn the_broadcast_bridge_keeps_the_offload_and_onload_order() {
    // The trainer streams its weights to both engines at once over the run's transport world.
    let t = staged_order("broadcast", "bucket_mb = 1.0");
    for m in t.metrics() {
        assert!(m["sync_bytes"].as_u64().unwrap() > 0, "{m}");
    }
}

/// Three steps with two colocated engines on `bridge`: every phase in order on each step.
fn staged_order(bridge: &str, bridge_options: &str) -> Scratch {
    let t = Scratch::warm();
    // A warm-started model and partial rewards, so that every step trains and syncs.
    let job = t.job(&JobOpts {
        engines: 2,
        steps: 3,
        // Rank 0 generates 2 groups, rank 1 one: a tail where rank 1 idles, as a rule.
        prompts: 3,
        bridge: bridge.into(),
        bridge_options: bridge_options.into(),
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let events = t.events();
    for step in 1..=3 {
        let at = |op: &str| positions(&events, step, op);
        let (pause, flush, release) = (at("pause"), at("flush"), at("release"));
        let (resume_w, sync, resume_kv, cont) =
            (at("resume"), at("sync"), at("resume_kv"), at("continue"));
        assert_eq!(
            pause.len(),
            2,
            "step {step}: one pause per engine: {events:#?}"
        );
        assert_eq!(flush.len(), 2);
        assert_eq!(release.len(), 2);
        assert!(
            max(&pause) < min(&flush),
            "step {step}: a flush before every pause ended"
        );
        assert!(
            max(&flush) < min(&release),
            "step {step}: a release before every flush ended"
        );
        assert_eq!(
            resume_w.len(),
            2,
            "step {step}: weights onloaded on both engines"
        );
        assert_eq!(sync.len(), 1, "step {step}: one sync");
        assert!(
            max(&resume_w) < min(&sync),
            "step {step}: sync before the weights were back"
        );
        assert!(
            max(&sync) < min(&resume_kv),
            "step {step}: KV back before the sync"
        );
        assert_eq!(cont.len(), 2);
        assert!(
            max(&resume_kv) < min(&cont),
            "step {step}: continue before the KV was back"
        );
        // Training happens between the release and the onload.
        let train = at("train");
        assert_eq!(train.len(), 1);
        assert!(max(&release) < train[0] && train[0] < min(&resume_w));
        // Each engine rank's bubble state: generating → released the moment its share is in
        // → completed once every share is in; all of it before the offload and the training.
        let bubble = |rank: usize, state: &str| -> usize {
            let v: Vec<usize> = at("bubble")
                .into_iter()
                .filter(|&i| {
                    events[i]["target"] == format!("engine-{rank}") && events[i]["detail"] == state
                })
                .collect();
            assert_eq!(
                v.len(),
                1,
                "step {step}: engine-{rank} {state} once: {events:#?}"
            );
            v[0]
        };
        let released: Vec<usize> = (0..2).map(|r| bubble(r, "released")).collect();
        let completed: Vec<usize> = (0..2).map(|r| bubble(r, "completed")).collect();
        for r in 0..2 {
            assert!(bubble(r, "generating") < released[r] && released[r] < completed[r]);
        }
        assert!(
            max(&released) < min(&completed),
            "step {step}: a rank completed while another still generated"
        );
        assert!(max(&completed) < min(&pause) && max(&completed) < train[0]);
    }
    let metrics = t.metrics();
    assert_eq!(metrics.len(), 3);
    for m in &metrics {
        // With two ranks the idle engine time is the tail: the early rank waits it out.
        let (tail, bubble) = (
            m["tail_s"].as_f64().unwrap(),
            m["bubble_s"].as_f64().unwrap(),
        );
        let generate = m["phases"]["generate"].as_f64().unwrap();
        assert!(tail >= 0.0 && tail <= generate, "{m}");
        assert!((bubble - tail).abs() < 1e-9, "{m}");
    }
    assert!(
        metrics
            .iter()
            .all(|m| m["weight_version"].as_u64().unwrap() >= 1)
    );
    assert!(t.dir.join("run/plot.png").is_file());
    assert!(
        t.dir
            .join("run/checkpoints/step-000003/tandem_loop_state.json")
            .is_file()
    );
    t
}

#[test]
fn an_engine_group_that_needs_no_offload_is_never_released() {
    let t = Scratch::new();
    let job = t.job(&JobOpts {
        steps: 2,
        extra_engine: "needs_offload = false\n".into(),
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let events = t.events();
    let engine_ops: Vec<&str> = events
        .iter()
        .filter(|e| e["target"].as_str().unwrap().starts_with("engine"))
        .map(|e| e["op"].as_str().unwrap())
        .collect();
    assert!(engine_ops.contains(&"pause") && engine_ops.contains(&"continue"));
    assert!(
        !engine_ops
            .iter()
            .any(|op| op.starts_with("release") || op.starts_with("resume")),
        "{engine_ops:?}"
    );
}

#[test]
fn disaggregated_runs_never_offload_and_kl_uses_the_reference() {
    let t = Scratch::warm();
    let job = t.job(&JobOpts {
        steps: 2,
        placement: "disaggregated".into(),
        extra_algorithm: "kl_coef = 0.05".into(),
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let events = t.events();
    let ops: Vec<&str> = events.iter().map(|e| e["op"].as_str().unwrap()).collect();
    for never in ["release", "resume", "resume_kv", "offload", "onload"] {
        assert!(
            !ops.contains(&never),
            "`{never}` in a disaggregated run: {ops:?}"
        );
    }
    // The reference is snapshotted at init and scored every step.
    assert!(
        events
            .iter()
            .any(|e| e["op"] == "snapshot" && e["detail"] == "ref")
    );
    assert_eq!(ops.iter().filter(|o| **o == "ref_logprobs").count(), 2);
    let metrics = t.metrics();
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        let kl = m["kl"].as_f64().unwrap();
        assert!(kl.is_finite() && kl >= 0.0, "{m}");
    }
}

#[test]
fn a_run_directory_is_never_overwritten() {
    let t = Scratch::new();
    let job = t.job(&JobOpts {
        steps: 1,
        ..JobOpts::default()
    });
    assert!(t.run(&job, &[]).status.success());
    let before = std::fs::read_to_string(t.dir.join("run/metrics.jsonl")).unwrap();
    let out = t.run(&job, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr_text());
    let err = out.stderr_text();
    assert!(
        err.contains("already holds a run") && err.contains("--resume"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(t.dir.join("run/metrics.jsonl")).unwrap(),
        before
    );
    // Rollouts are written only when the job asks for them.
    assert!(!t.dir.join("run/rollouts.jsonl").exists());
}

#[test]
fn dump_rollouts_writes_every_sample_of_every_step() {
    let t = Scratch::new();
    let job = t.job(&JobOpts {
        steps: 2,
        prompts: 2,
        group: 2,
        extra_run: "dump_rollouts = true\n".into(),
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let text = std::fs::read_to_string(t.dir.join("run/rollouts.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // prompts × group samples per step.
    assert_eq!(lines.len(), 2 * 2 * 2, "{text}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["step"].as_u64(), Some(i as u64 / 4 + 1), "{l}");
        for key in [
            "group",
            "prompt",
            "completion",
            "tokens",
            "logprobs",
            "reward",
            "advantage",
        ] {
            assert!(!l[key].is_null(), "{key} missing in {l}");
        }
        assert!(l["prompt"].as_str().unwrap().contains('+'), "{l}");
        assert_eq!(
            l["tokens"].as_array().unwrap().len(),
            l["logprobs"].as_array().unwrap().len(),
            "{l}"
        );
    }
}

#[test]
fn a_killed_engine_stops_the_run_with_a_clear_error_without_restarts() {
    let t = Scratch::new();
    // `max_restarts = 0`: a death stops the run (restarts are `recovery.rs`'s).
    let job = t.job(&JobOpts {
        steps: 200,
        extra_run: "max_restarts = 0\n".into(),
        ..JobOpts::default()
    });
    let mut child = t.spawn(&job, &[]);
    wait_for(Duration::from_secs(120), || t.metrics_lines() >= 1);
    let pid = worker_pid(&t.dir.join("run"), "engine", 0).expect("engine worker pid");
    let killed = Instant::now();
    kill9(pid);
    let out = wait_output(&mut child, Duration::from_secs(60));
    assert!(killed.elapsed() < Duration::from_secs(60), "the run hung");
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr_text());
    let err = out.stderr_text();
    assert!(err.contains("engine rank 0"), "{err}");
    assert!(err.contains("SIGKILL") || err.contains("signal 9"), "{err}");
}

#[test]
fn a_killed_trainer_without_restarts_resumes_from_the_last_checkpoint() {
    let t = Scratch::warm();
    let job = t.job(&JobOpts {
        steps: 200,
        save_every: 2,
        extra_run: "max_restarts = 0\n".into(),
        ..JobOpts::default()
    });
    let mut child = t.spawn(&job, &[]);
    let ck = t.dir.join("run/checkpoints/step-000004");
    wait_for(Duration::from_secs(180), || {
        ck.join("tandem_loop_state.json").is_file()
    });
    let pid = worker_pid(&t.dir.join("run"), "trainer", 0).expect("trainer worker pid");
    kill9(pid);
    let out = wait_output(&mut child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr_text());
    assert!(
        out.stderr_text().contains("trainer rank 0"),
        "{}",
        out.stderr_text()
    );

    // The newest complete checkpoint and its loop state.
    let newest = newest_checkpoint(&t.dir.join("run"));
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(newest.join("tandem_loop_state.json")).unwrap(),
    )
    .unwrap();
    let step = state["step"].as_u64().unwrap();
    let version = state["weight_version"].as_u64().unwrap();
    let resumed_to = step + 2;
    let out = t.tandem(&[
        "run",
        "--resume",
        t.dir.join("run").to_str().unwrap(),
        "--steps",
        &resumed_to.to_string(),
    ]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let events = t.events();
    let resume = events
        .iter()
        .rev()
        .find(|e| e["op"] == "load_checkpoint")
        .expect("a resume event");
    let detail = resume["detail"].as_str().unwrap();
    assert!(
        detail.contains(newest.file_name().unwrap().to_str().unwrap())
            && detail.ends_with(&format!("version {version}")),
        "{detail} vs {} v{version}",
        newest.display()
    );
    // After the resume the engines serve the checkpoint's weights: the init sync carries its
    // version, and each later step adds one.
    let syncs: Vec<String> = events
        .iter()
        .skip_while(|e| e["op"] != "load_checkpoint")
        .filter(|e| e["op"] == "sync")
        .map(|e| e["detail"].as_str().unwrap().to_string())
        .collect();
    assert!(
        syncs[0].starts_with(&format!("version {version} ")),
        "{syncs:?}"
    );
    // Metrics: steps 1..=resumed_to, each once, in order.
    let steps = steps_of(&t.metrics());
    assert_eq!(steps, (1..=resumed_to).collect::<Vec<_>>());
}

#[test]
fn memory_is_flat_over_many_colocated_steps() {
    let t = Scratch::warm();
    // The same engine and trainer processes for all 100 steps (reload in place), releasing
    // and resuming weights and KV cache every step. Sampling at temperature 2 with room for
    // 12 tokens, completion lengths vary from step to step and grow over the run (the
    // longest batches come late), so memory that followed the longest batch seen would
    // grow after the early window. The trainer's micro-batch limit sizes its activations
    // once at init (without one it has no bound to size them for: they follow the largest
    // batch seen, and this test fails on the ledger).
    let job = t.job(&JobOpts {
        steps: 100,
        prompts: 1,
        group: 4,
        max_tokens: 12,
        bridge_options: "restart = false".into(),
        extra_trainer: "[trainer.options]\nmicro_batch_tokens = 128\n".into(),
        extra_algorithm: "temperature = 2.0\n".into(),
        ..JobOpts::default()
    });
    // glibc's dynamic mmap threshold (raised to the largest block freed so far) keeps freed
    // blocks of up to a few MiB in the workers' arenas, at a level that steps up at a step
    // that varies run to run (measured: the engine's `rss_data` at 20.7 or 23.5 MiB over the
    // same steps); a fixed threshold returns them, so `rss_data` is what the workers hold.
    let out = std::process::Command::new(tandem_bin())
        .arg("run")
        .arg(&job)
        .current_dir(&t.dir)
        .env("MALLOC_MMAP_THRESHOLD_", "131072")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", out.stderr_text());
    let metrics = t.metrics();
    assert_eq!(metrics.len(), 100);
    // Not vacuous: the mean completion length moves over the run, and some step after the
    // early window has longer completions than any step in it.
    let lengths: Vec<f64> = metrics
        .iter()
        .map(|m| m["completion_tokens"].as_f64().unwrap())
        .collect();
    let longest = |r: std::ops::Range<usize>| lengths[r].iter().copied().fold(0.0, f64::max);
    let shortest = lengths.iter().copied().fold(f64::MAX, f64::min);
    assert!(
        longest(0..100) - shortest >= 4.0 && longest(11..100) > longest(0..11),
        "completion lengths must vary and grow after step 11: {lengths:?}"
    );
    // The ledger is exact: step 1 against every later step. Of RSS, the memory the workers
    // allocated (`rss_data`: the file-backed rest moves with the machine's load), within 2 %
    // or 2 MiB (allocator arenas) — the medians of steps 1-11 and 80-100, since one sample
    // of a heap moves with fragmentation and load.
    for worker in ["engine-0", "trainer"] {
        let at1 = &metrics[0]["ledger"][worker];
        assert!(at1.as_u64().unwrap() > 0, "ledger of {worker}: {at1}");
        for m in &metrics {
            assert_eq!(
                &m["ledger"][worker], at1,
                "ledger of {worker} at step {} against step 1",
                m["step"]
            );
        }
    }
    let (early, late) = (1..=11, 80..=100);
    let rss = metrics[0]["rss_data"].as_object().unwrap();
    assert_eq!(rss.len(), 2, "engine-0 + trainer: {rss:?}");
    for worker in rss.keys() {
        let (was, now) = (
            median_of(&metrics, "rss_data", worker, early.clone()),
            median_of(&metrics, "rss_data", worker, late.clone()),
        );
        let change = (now - was).abs() / was.max(1.0);
        assert!(
            was > 0.0 && (now - was).abs() <= (0.02 * was).max(2.0 * 1024.0 * 1024.0),
            "rss_data of {worker}: {was} bytes over steps {early:?}, {now} over {late:?} \
             ({:.1}%)",
            change * 100.0
        );
    }
}
