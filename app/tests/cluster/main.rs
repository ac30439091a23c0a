//! The `tandem` binary across two "hosts": network namespaces made by `scripts/cluster/`
//! (`slurm-up.sh`: a Slurm cluster; `ray-up.sh`: a Ray cluster), and the transport bench
//! across them. Every test is `#[ignore]`d (it needs root and the cluster); `.ci/run` runs
//! each area after bringing its cluster up, one test thread:
//!
//! ```text
//! SLURM_CONF=DIR/slurm.conf cargo test -p tandem --test cluster -- --ignored --test-threads=1 slurm::
//! cargo test -p tandem --test cluster -- --ignored --exact netns_bench::bench_transport_across_netns_prints_tcp_beside_the_plain_socket_copy
//! TANDEM_RAY_HEAD_PID=... TANDEM_RAY_PYTHON=... cargo test -p tandem --test cluster -- --ignored --test-threads=1 ray::
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

#[path = "../common/mod.rs"]
mod common;
mod hosts;

mod netns_bench;
mod ray;
mod slurm;

/// The token probe's side on n2, named exactly `token_child`: `hosts::probe_from_n2_without_token`
/// runs this binary there (for `slurm::c_...`, `slurm::d_...` and `ray::c_...`).
#[test]
#[ignore = "child entry point: run on n2 by hosts::probe_from_n2_without_token"]
fn token_child() {
    hosts::token_child();
}
