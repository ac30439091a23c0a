//! Two real "hosts" through Slurm: `scripts/cluster/slurm-up.sh` makes nodes n1 (10.77.1.1)
//! and n2 (10.77.1.2), each in its own network, UTS and mount namespace (its own IP, host
//! name and `/dev/shm`), slurmctld and munged in this namespace (10.77.1.254, the login
//! node). `tandem run` here starts every worker with `srun` on the node its job names:
//!
//! - the quickstart task, engine on n1 and trainer on n2, learns over 20 steps through the
//!   `checkpoint` bridge, and through `broadcast` (tcp: the nodes share no memory, so a
//!   shared-memory path between them would fail the run); `metrics.jsonl` names each
//!   worker's host;
//! - the remote engine and then the remote trainer killed on their nodes (SIGKILL to the
//!   worker process there) are each reported with their rank and node and replaced; a
//!   connection from n2 without the run token is refused and logged; the run ends with every
//!   step done, and no worker of the run is left on either node;
//! - a connection to the control plane from n2 without the run token is refused.
//!
//! Run by `.ci/run` between `slurm-up.sh` and `slurm-down.sh`:
//! ```sh
//! bash scripts/cluster/slurm-up.sh /tmp/tandem-slurm
//! SLURM_CONF=/tmp/tandem-slurm/slurm.conf cargo test -p tandem --test cluster -- --ignored --test-threads=1 slurm::
//! bash scripts/cluster/slurm-down.sh /tmp/tandem-slurm
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::hosts::{metrics, probe_from_n2_without_token, text, wait_no_workers};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tandem_control::{ControlServer, Role};

/// The login node's address on the nodes' bridge.
const LOGIN: &str = "10.77.1.254";

fn tandem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
    c.env("SLURM_CONF", slurm_conf());
    c
}

/// `$SLURM_CONF` of the cluster `slurm-up.sh` made; panics with how to make one when unset,
/// so an `--ignored` run never passes without a cluster.
fn slurm_conf() -> String {
    std::env::var("SLURM_CONF").unwrap_or_else(|_| {
        panic!(
            "SLURM_CONF is unset: run `bash scripts/cluster/slurm-up.sh DIR` (root, slurm-wlm, \
             munge, iproute2) and export SLURM_CONF=DIR/slurm.conf"
        )
    })
}

const LAUNCHER: &str = r#"[launcher]
kind = "slurm"
advertise = "10.77.1.254"
engine_nodes = ["n1"]
trainer_nodes = ["n2"]"#;

fn job(dir: &Path, bridge: &str, steps: u32, bridge_options: &str) -> PathBuf {
    crate::hosts::job(dir, bridge, steps, bridge_options, LAUNCHER)
}

fn learns_across_two_hosts(bridge: &str) {
    crate::hosts::learns_across_two_hosts((bridge, ""), LAUNCHER, |job| {
        let mut c = tandem();
        c.arg("run").arg(job);
        c
    });
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (SLURM_CONF)"]
fn engine_on_n1_trainer_on_n2_learn_through_the_checkpoint_bridge() {
    learns_across_two_hosts("checkpoint");
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (SLURM_CONF)"]
fn engine_on_n1_trainer_on_n2_learn_through_broadcast_over_tcp() {
    learns_across_two_hosts("broadcast");
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (SLURM_CONF)"]
fn remote_workers_killed_on_their_nodes_are_named_and_replaced_a_tokenless_peer_is_refused() {
    crate::hosts::workers_killed_on_their_nodes_are_named_and_replaced(
        LAUNCHER,
        |job| {
            let mut c = tandem();
            c.arg("run").arg(job);
            c
        },
        ("engine rank 0 (on node n1", "trainer rank 0 (on node n2"),
    );
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (its network namespaces)"]
fn a_connection_from_n2_without_the_token_is_refused() {
    let _ = slurm_conf();
    let server = ControlServer::bind(format!("{LOGIN}:0").parse().unwrap()).unwrap();
    probe_from_n2_without_token(server.local_addr());
    assert_eq!(server.rejected_peers(), 1);
    assert!(
        server
            .claim(Role::Engine, 0, Duration::from_millis(100))
            .is_none()
    );
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (SLURM_CONF)"]
fn the_sbatch_script_of_a_job_runs_it_in_an_allocation_with_the_controller_on_n1() {
    let t = tempfile::tempdir().unwrap();
    let job = job(t.path(), "checkpoint", 4, "");
    let auto = std::fs::read_to_string(&job)
        .unwrap()
        .replace(&format!("advertise = \"{LOGIN}\""), "advertise = \"auto\"");
    assert!(auto.contains("advertise = \"auto\""));
    std::fs::write(&job, auto).unwrap();
    let script = t.path().join("job.sbatch");
    let out = tandem()
        .args(["launch", "--sbatch"])
        .arg(&job)
        .arg("--out")
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // Bounded: a job that never ends is a failure, not a hang.
    let out = Command::new("timeout")
        .args(["600", "sbatch", "--wait"])
        .arg(&script)
        .env("SLURM_CONF", slurm_conf())
        .current_dir(t.path())
        .output()
        .unwrap();
    let slurm_out: String = std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("slurm-cluster-")
        })
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        out.status.success(),
        "sbatch --wait: {}{slurm_out}",
        text(&out)
    );
    assert!(slurm_out.contains("done: 4 steps"), "{slurm_out}");
    let run = t.path().join("run");
    let m = metrics(&run);
    assert_eq!(m.len(), 4);
    assert_eq!(m[3]["hosts"]["trainer"], "n2 (10.77.1.2)");
    // advertise = "auto": the batch step ran on n1, so the workers dialed n1's address.
    let log = std::fs::read_to_string(run.join("logs/trainer-0.log")).unwrap();
    assert!(log.contains("connected to 10.77.1.1:"), "{log}");
    assert_eq!(wait_no_workers(&run), Vec::<String>::new());
}
