//! `tandem bench trainers --quick`: the megatron rows beside fsdp and native, measured in the
//! same run on the same batch.

use crate::common::*;
use crate::torchrun_fixture::*;

pub(super) fn h_bench_trainers_puts_megatron_beside_fsdp_and_native_on_the_same_batch() {
    plugin_lib("tandem-plugin-megatron", "libtandem_megatron.so");
    plugin_lib("tandem-plugin-fsdp", "libtandem_fsdp.so");
    let out = run(tandem()
        .args(["bench", "trainers", "--quick", "--json", "--plugin-dir"])
        .arg(&fixture().plugins)
        .env("TANDEM_PYTHON", python()));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cases: Vec<&str> = figures
        .iter()
        .map(|f| f["case"].as_str().unwrap())
        .collect();
    assert_eq!(
        cases,
        [
            "tiny native grpo step b8x64",
            "tiny fsdp ranks=1 grpo step b8x64",
            "tiny fsdp ranks=2 grpo step b8x64",
            "tiny megatron tp=1 grpo step b8x64",
            "tiny megatron tp=2 grpo step b8x64",
        ]
    );
    let value = |case: &str| {
        figures.iter().find(|f| f["case"] == case).unwrap()["value"]
            .as_f64()
            .unwrap()
    };
    for f in &figures {
        assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
    }
    // Each megatron row stands beside fsdp with as many ranks, measured in the same run.
    let tp2 = figures.iter().find(|f| f["case"] == cases[4]).unwrap();
    assert_eq!(tp2["limit"].as_f64().unwrap(), value(cases[2]));
    assert_eq!(tp2["limit_name"], "fsdp ranks=2 step, same batch");
    // The same batch: every trainer's first step has the native trainer's gradient norm.
    let err = stderr(&out);
    let norms: Vec<f64> = err
        .lines()
        .filter_map(|l| l.split("grad norm ").nth(1))
        .map(|x| x.trim().parse().unwrap())
        .collect();
    assert_eq!(norms.len(), 5, "{err}");
    for n in &norms {
        assert!((n - norms[0]).abs() <= 1e-4 * norms[0], "{norms:?}");
    }
}
