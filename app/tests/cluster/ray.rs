//! Two real "hosts" through Ray: `scripts/cluster/ray-up.sh` makes nodes n1 (10.77.1.1, the
//! head) and n2 (10.77.1.2), each in its own network, UTS and mount namespace (its own IP,
//! host name and `/dev/shm`). The controller runs on n1 (a Ray driver needs a Ray node: the
//! tests enter the head's namespaces), and `[launcher] kind = "ray"` places the engine on n1
//! and the trainer on n2 in one STRICT_SPREAD placement group:
//!
//! - the quickstart task learns over 20 steps through the `checkpoint` bridge (reloaded in
//!   place), and through
//!   `broadcast` (tcp: the nodes share no memory); `metrics.jsonl` names each worker's host;
//! - the remote engine and then the remote trainer killed on their nodes (SIGKILL to the
//!   worker process there) are each reported with their rank and node and replaced in their
//!   bundle; a connection from n2 without the run token is refused and logged; the run ends
//!   with every step done, and no worker of the run is left on either node.
//!
//! Run by `.ci/run` between `ray-up.sh` and `ray-down.sh`:
//! ```sh
//! py=$(bash scripts/setup-ray.sh | tail -n1)
//! bash scripts/cluster/ray-up.sh /tmp/tandem-ray "$py"
//! TANDEM_RAY_HEAD_PID=$(cat /tmp/tandem-ray/head.pid) TANDEM_RAY_PYTHON=$py \
//!   cargo test -p tandem --test cluster -- --ignored --test-threads=1 ray::
//! bash scripts/cluster/ray-down.sh /tmp/tandem-ray
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

const LAUNCHER: &str = r#"[launcher]
kind = "ray"
address = "10.77.1.1:6379"
strategy = "STRICT_SPREAD"
advertise = "auto"
engine_nodes = ["10.77.1.1"]
trainer_nodes = ["10.77.1.2"]"#;

/// The pid of the head node's `ray start --block` (in n1's namespaces); panics with how to
/// make the cluster when unset, so an `--ignored` run never passes without one.
fn head_pid() -> String {
    std::env::var("TANDEM_RAY_HEAD_PID").unwrap_or_else(|_| {
        panic!(
            "TANDEM_RAY_HEAD_PID is unset: run `bash scripts/cluster/ray-up.sh DIR PYTHON` (root, \
             iproute2, PYTHON from scripts/setup-ray.sh) and export TANDEM_RAY_HEAD_PID=$(cat \
             DIR/head.pid) TANDEM_RAY_PYTHON=PYTHON"
        )
    })
}

/// `tandem run JOB` on n1: in the head node's network, UTS and mount namespaces.
fn tandem_run_on_n1(job: &Path) -> Command {
    let mut c = Command::new("nsenter");
    c.args(["-t", &head_pid(), "-m", "-n", "-u"])
        .arg(env!("CARGO_BIN_EXE_tandem"))
        .arg("run")
        .arg(job);
    c
}

#[test]
#[ignore = "needs a Ray cluster from scripts/cluster/ray-up.sh (TANDEM_RAY_HEAD_PID)"]
fn engine_on_n1_trainer_on_n2_learn_through_the_checkpoint_bridge() {
    // Reloaded in place: a restart per step is a new Ray driver per step (~3 s of Python
    // start-up on a busy 2-core machine); `c_...` restarts workers in their bundles.
    crate::hosts::learns_across_two_hosts(
        ("checkpoint", "restart = false"),
        LAUNCHER,
        tandem_run_on_n1,
    );
}

#[test]
#[ignore = "needs a Ray cluster from scripts/cluster/ray-up.sh (TANDEM_RAY_HEAD_PID)"]
fn engine_on_n1_trainer_on_n2_learn_through_broadcast_over_tcp() {
    crate::hosts::learns_across_two_hosts(("broadcast", ""), LAUNCHER, tandem_run_on_n1);
}

#[test]
#[ignore = "needs a Ray cluster from scripts/cluster/ray-up.sh (TANDEM_RAY_HEAD_PID)"]
fn remote_workers_killed_on_their_nodes_are_named_and_replaced_a_tokenless_peer_is_refused() {
    crate::hosts::workers_killed_on_their_nodes_are_named_and_replaced(
        LAUNCHER,
        tandem_run_on_n1,
        (
            "engine rank 0 (in Ray bundle 0 on 10.77.1.1",
            "trainer rank 0 (in Ray bundle 1 on 10.77.1.2",
        ),
    );
}
