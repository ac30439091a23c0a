//! The benchmark output convention: `--json` prints one object per figure with the keys
//! `bench`, `case`, `value`, `unit`, `limit`, `ratio`, and `ratio == value / limit`.
//! (No timing is asserted: figures are for people, targets live in the printed table.)

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use common::*;

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
