//! `tandem bench transport --across-netns` between the login node and n2 (the network
//! namespace of `scripts/cluster/slurm-up.sh`): tcp beside a plain socket copy. Needs root
//! and the `tnd-n2` namespace, so it is ignored by default; `.ci/run` runs it while the Slurm
//! cluster is up.

#![allow(clippy::unwrap_used)]

use crate::common::*;

/// Needs root and `tnd-n2` (`scripts/cluster/netns-up.sh`, or a running test cluster).
#[test]
#[ignore = "needs root and the tnd-n2 network namespace"]
fn bench_transport_across_netns_prints_tcp_beside_the_plain_socket_copy() {
    let out = run(tandem().args([
        "bench",
        "transport",
        "--across-netns",
        "tnd-n2",
        "--quick",
        "--json",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert!(!figures.is_empty());
    for f in &figures {
        assert_eq!(f["bench"], "transport");
        assert_eq!(f["unit"], "GB/s");
        assert_eq!(f["limit_name"], "plain socket copy");
        assert_eq!(f["target"], ">= 0.7");
        let (value, limit) = (f["value"].as_f64().unwrap(), f["limit"].as_f64().unwrap());
        assert!(value > 0.0 && limit > 0.0, "{f}");
        assert!(f["case"].as_str().unwrap().contains("across netns tnd-n2"));
    }
}
