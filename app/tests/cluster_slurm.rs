//! Two real "hosts" through Slurm: `scripts/cluster/slurm-up.sh` makes nodes n1 (10.77.1.1)
//! and n2 (10.77.1.2), each in its own network, UTS and mount namespace (its own IP, host
//! name and `/dev/shm`), slurmctld and munged in this namespace (10.77.1.254, the login
//! node). `tandem run` here starts every worker with `srun` on the node its job names:
//!
//! - the quickstart task, engine on n1 and trainer on n2, learns over 20 steps through the
//!   `checkpoint` bridge, and through `broadcast` (tcp: the nodes share no memory, so a
//!   shared-memory path between them would fail the run); `metrics.jsonl` names each
//!   worker's host;
//! - the remote engine killed on its node (SIGKILL to the worker process there) is reported
//!   with its rank and node and replaced; the run ends with every step done, and no worker
//!   of the run is left on either node;
//! - a connection to the control plane from n2 without the run token is refused.
//!
//! Run by `.ci/run` between `slurm-up.sh` and `slurm-down.sh`:
//! ```sh
//! bash scripts/cluster/slurm-up.sh /tmp/tandem-slurm
//! SLURM_CONF=/tmp/tandem-slurm/slurm.conf cargo test --workspace --test cluster_slurm -- --ignored --test-threads=1
//! bash scripts/cluster/slurm-down.sh /tmp/tandem-slurm
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster_common;
mod common;

use cluster_common::{metrics, probe_from_n2_without_token, text, wait_no_workers, worker_pid};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
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
    cluster_common::job(dir, bridge, steps, bridge_options, LAUNCHER)
}

fn learns_across_two_hosts(bridge: &str) {
    cluster_common::learns_across_two_hosts((bridge, ""), LAUNCHER, |job| {
        let mut c = tandem();
        c.arg("run").arg(job);
        c
    });
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (SLURM_CONF)"]
fn a_engine_on_n1_trainer_on_n2_learn_through_the_checkpoint_bridge() {
    learns_across_two_hosts("checkpoint");
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (SLURM_CONF)"]
fn b_engine_on_n1_trainer_on_n2_learn_through_broadcast_over_tcp() {
    learns_across_two_hosts("broadcast");
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (SLURM_CONF)"]
fn c_a_remote_engine_killed_on_its_node_is_named_and_replaced_and_nothing_is_left() {
    let t = tempfile::tempdir().unwrap();
    // Reload in place: the engine process stays the same from step to step.
    let job = job(t.path(), "checkpoint", 8, "restart = false");
    let run = t.path().join("run");
    let mut child = tandem()
        .arg("run")
        .arg(&job)
        .current_dir(t.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // After step 2 is recorded, kill the engine's worker process on n1.
    let deadline = Instant::now() + Duration::from_secs(600);
    while metrics(&run).len() < 2 {
        assert!(Instant::now() < deadline, "step 2 not reached");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    let pid = worker_pid(&run, "engine").expect("the engine's log names its pid");
    let host = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-u", "hostname"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&host.stdout).trim(),
        "n1",
        "pid {pid} runs on n1"
    );
    assert!(
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    let err = text(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.contains("ERROR") && l.contains("engine rank 0 (on node n1")),
        "no error line names the rank and its node: {err}"
    );
    let m = metrics(&run);
    let steps: Vec<u64> = m.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (1..=8).collect::<Vec<u64>>(), "every step once");
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert!(events.contains("\"recovered\""), "{events}");
    assert_eq!(m[7]["hosts"]["engine-0"], "n1 (10.77.1.1)");
    assert_eq!(wait_no_workers(&run), Vec::<String>::new());
}

#[test]
#[ignore = "child entry point: run on n2 by d_a_connection_from_n2_without_the_token_is_refused"]
fn token_child() {
    cluster_common::token_child();
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (its network namespaces)"]
fn d_a_connection_from_n2_without_the_token_is_refused() {
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
fn e_the_sbatch_script_of_a_job_runs_it_in_an_allocation_with_the_controller_on_n1() {
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
