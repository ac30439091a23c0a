//! The benchmark output convention: `--json` prints one object per figure with the keys
//! `bench`, `case`, `value`, `unit`, `limit`, `ratio`, and `ratio == value / limit`.
//! (No timing is asserted: figures are for people, targets live in the printed table.)
//! `tandem bench native --quick --json`: its five figures, well formed, without Python;
//! `tandem bench spec --quick --json`: its drafter, decode and transfer figures;
//! `tandem bench serve --quick --json`: HTTP beside in-process figures at 1/8/64 clients;
//! `tandem bench soak --quick --json`: ledger drift, memory growth and acceptance figures.
//! `tandem bench env --quick --json`: Python reward and `math` verifier figures beside their
//! limits (any Python 3 with the standard library).
//! `tandem bench transport --across-netns`: a missing namespace is one error line with its fix;
//! the cross-namespace figures themselves need root (ignored test).

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;

#[test]
fn bench_abi_json_has_one_object_per_figure() {
    let out = run(tandem().args(["bench", "abi", "--quick", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(figures.len(), 2);
    for f in &figures {
        assert_eq!(f["bench"], "abi");
        assert_eq!(f["unit"], "ns/call");
        let (value, limit, ratio) = (
            f["value"].as_f64().unwrap(),
            f["limit"].as_f64().unwrap(),
            f["ratio"].as_f64().unwrap(),
        );
        assert!(value > 0.0 && limit > 0.0);
        assert!((ratio - value / limit).abs() < 1e-9);
        assert!(f["case"].as_str().unwrap().contains("across the ABI"));
    }
}

#[test]
fn bench_table_prints_value_beside_limit() {
    let out = run(tandem().args(["bench", "abi", "--quick"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let header = text.lines().next().unwrap();
    for col in [
        "bench", "case", "value", "limit", "limit is", "ratio", "target",
    ] {
        assert!(header.contains(col), "{header}");
    }
    assert!(text.contains("direct dyn call"));
}

#[test]
fn bench_native_quick_json_prints_decode_and_step_figures() {
    // --quick runs the tiny preset against the machine bounds: no Python is needed (and a
    // Python named here would not be run).
    let out = run(tandem()
        .args(["bench", "native", "--quick", "--json"])
        .env("TANDEM_PYTHON", "/nonexistent/python"));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let cases: Vec<&str> = figures
        .iter()
        .map(|f| f["case"].as_str().unwrap())
        .collect();
    assert_eq!(
        cases,
        [
            "tiny decode b1",
            "tiny decode b8",
            "tiny decode b64",
            "tiny grpo step b8x64 full",
            "tiny grpo step b8x64 lora",
        ]
    );
    for f in &figures {
        assert_eq!(f["bench"], "native");
        let unit = if f["case"].as_str().unwrap().contains("decode") {
            "tok/s"
        } else {
            "s"
        };
        assert_eq!(f["unit"], unit, "{f}");
        let (value, limit, ratio) = (
            f["value"].as_f64().unwrap(),
            f["limit"].as_f64().unwrap(),
            f["ratio"].as_f64().unwrap(),
        );
        assert!(value > 0.0 && limit > 0.0, "{f}");
        assert!(
            (ratio - value / limit).abs() < 1e-9 * ratio.abs().max(1.0),
            "{f}"
        );
        let name = f["limit_name"].as_str().unwrap();
        assert!(name.contains("bound"), "{f}");
    }
    assert!(stderr(&out).contains("--quick"), "{}", stderr(&out));
}

#[test]
fn bench_spec_quick_json_prints_drafter_decode_and_transfer_figures() {
    // --quick: the tiny preset (a short warm start), a drafter trained in the run, decode at
    // batch 1/4/16 with and without it, one 1 MiB hidden-state transfer between two workers.
    let out = run(tandem().args(["bench", "spec", "--quick", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let cases: Vec<&str> = figures
        .iter()
        .map(|f| f["case"].as_str().unwrap())
        .collect();
    let mut expected = vec!["tiny drafter train acc_0".to_string()];
    for b in [1, 4, 16] {
        expected.push(format!("tiny decode b{b}"));
        expected.push(format!("tiny spec decode b{b}"));
        expected.push(format!("tiny spec speedup b{b}"));
    }
    expected.push("tiny hidden states 1 MiB".into());
    assert_eq!(cases, expected);
    for f in &figures {
        assert_eq!(f["bench"], "spec");
        let (value, limit, ratio) = (
            f["value"].as_f64().unwrap(),
            f["limit"].as_f64().unwrap(),
            f["ratio"].as_f64().unwrap(),
        );
        assert!(
            value.is_finite() && limit.is_finite() && ratio.is_finite(),
            "{f}"
        );
        assert!(value > 0.0 && limit > 0.0, "{f}");
        assert!(
            (ratio - value / limit).abs() < 1e-9 * ratio.abs().max(1.0),
            "{f}"
        );
        let case = f["case"].as_str().unwrap();
        let unit = f["unit"].as_str().unwrap();
        if case.contains("speedup") {
            // The limit is the mean acceptance length: 1 ..= draft_tokens + 1 tokens per
            // verification (draft_tokens = 4).
            assert_eq!(unit, "x", "{f}");
            assert!((1.0..=5.0).contains(&limit), "{f}");
        } else if case.contains("decode") {
            assert_eq!(unit, "tok/s", "{f}");
        } else if case.contains("hidden states") {
            assert_eq!(unit, "GB/s", "{f}");
            assert_eq!(f["limit_name"], "memcpy, same size", "{f}");
        } else {
            assert!(limit == 1.0 && value <= 1.0, "{f}");
        }
    }
    let err = stderr(&out);
    assert!(err.contains("final training accuracy"), "{err}");
}

#[test]
fn bench_serve_quick_json_prints_http_beside_in_process_figures() {
    // --quick: an in-process `tandem serve` on a free port, 1/8/64 clients, beside the same
    // requests through the engine in process.
    let out = run(tandem().args(["bench", "serve", "--quick", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(figures.len(), 6);
    for (f, clients) in figures.iter().zip([1, 1, 8, 8, 64, 64]) {
        assert_eq!(f["bench"], "serve");
        let case = f["case"].as_str().unwrap();
        assert!(case.starts_with(&format!("{clients} clients")), "{case}");
        let unit = if case.ends_with("requests/s") {
            "req/s"
        } else {
            "tok/s"
        };
        assert_eq!(f["unit"], unit);
        let (value, limit, ratio) = (
            f["value"].as_f64().unwrap(),
            f["limit"].as_f64().unwrap(),
            f["ratio"].as_f64().unwrap(),
        );
        assert!(value > 0.0 && limit > 0.0, "{f}");
        assert!(
            (ratio - value / limit).abs() < 1e-9 * ratio.abs().max(1.0),
            "{f}"
        );
    }
}

#[test]
fn bench_soak_quick_json_prints_ledger_memory_and_acceptance_figures() {
    // --quick: examples/drafter.toml as shipped, 40 steps (its model created in a scratch
    // directory). The ledger is exact accounting, so its drift is checked here; the memory
    // growth figures are for people (the heap moves by a few MB with the machine's load).
    let out = run(tandem().args(["bench", "soak", "--quick", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let case = |f: &serde_json::Value| f["case"].as_str().unwrap().to_owned();
    let with = |part: &str| -> Vec<&serde_json::Value> {
        figures.iter().filter(|f| case(f).contains(part)).collect()
    };
    let drift = with("ledger drift after step 10");
    let workers: Vec<String> = drift
        .iter()
        .map(|f| case(f).split(':').next().unwrap().to_owned())
        .collect();
    assert_eq!(workers, ["engine-0", "trainer"], "{figures:?}");
    for f in &drift {
        assert!(f["limit"].as_f64().unwrap() > 0.0, "{f}");
        assert!(
            f["ratio"].as_f64().unwrap() <= 0.02,
            "the ledger drifted: {f}"
        );
    }
    assert_eq!(with("allocated memory growth over the run").len(), 2);
    assert_eq!(with("allocated memory growth in the calmer half").len(), 2);
    for f in &figures {
        assert_eq!(f["bench"], "soak");
        let (value, limit, ratio) = (
            f["value"].as_f64().unwrap(),
            f["limit"].as_f64().unwrap(),
            f["ratio"].as_f64().unwrap(),
        );
        assert!(
            (ratio - value / limit).abs() < 1e-9 * ratio.abs().max(1.0),
            "{f}"
        );
    }
    let accept = |s: u32| {
        let f = with(&format!("acceptance length at step {s}"));
        assert_eq!(f.len(), 1, "{figures:?}");
        assert_eq!(f[0]["limit"], 5.0, "draft_tokens + 1");
        f[0]["value"].as_f64().unwrap()
    };
    let (first, last) = (accept(0), accept(40));
    assert!(
        (1.0..=5.0).contains(&first) && (1.0..=5.0).contains(&last),
        "{first} {last}"
    );
    assert!(
        last > first,
        "training did not raise acceptance: {first} -> {last}"
    );
}

#[test]
fn bench_env_quick_json_prints_reward_throughput_beside_its_limits() {
    // --quick: 64 samples through the `dataset` environment: a bare Python reward, a 3 ms one
    // with 1/2/4 workers, the built-in `math` verifier. Any Python 3 runs the rewards
    // (standard library only): `$TANDEM_PYTHON` when set, else `python3` from the PATH.
    let python = std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = run(tandem()
        .args(["bench", "env", "--quick", "--json"])
        .env("TANDEM_PYTHON", python));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let cases: Vec<&str> = figures
        .iter()
        .map(|f| f["case"].as_str().unwrap())
        .collect();
    let mut expected =
        vec!["python bare reward (verl), 64 samples, 1 worker: per sample".to_string()];
    for w in [1, 2, 4] {
        let case = format!("python 3 ms reward (time.sleep), 64 samples, {w} workers");
        expected.push(format!("{case}: s per step"));
        expected.push(format!("{case}: samples/s"));
    }
    expected.push("rust math verifier, 64 samples: per sample".into());
    assert_eq!(cases, expected);
    for f in &figures {
        assert_eq!(f["bench"], "env");
        let case = f["case"].as_str().unwrap();
        let unit = if case.ends_with("per sample") {
            "us"
        } else if case.ends_with("per step") {
            "s"
        } else {
            "samples/s"
        };
        assert_eq!(f["unit"], unit, "{f}");
        let (value, limit, ratio) = (
            f["value"].as_f64().unwrap(),
            f["limit"].as_f64().unwrap(),
            f["ratio"].as_f64().unwrap(),
        );
        assert!(value > 0.0 && limit > 0.0, "{f}");
        assert!(
            (ratio - value / limit).abs() < 1e-9 * ratio.abs().max(1.0),
            "{f}"
        );
        assert!(!f["limit_name"].as_str().unwrap().is_empty(), "{f}");
    }
}

#[test]
fn bench_transport_across_a_missing_netns_is_one_error_line_with_the_fix() {
    let out = run(tandem().args(["bench", "transport", "--across-netns", "tnd-no-such-ns"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("tnd-no-such-ns does not exist"),
        "{lines:?}"
    );
    assert!(
        lines[0].contains("scripts/cluster/netns-up.sh"),
        "{lines:?}"
    );
    assert!(stdout(&out).is_empty());
}
