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
//!   cargo test --workspace --test cluster_ray -- --ignored --test-threads=1
//! bash scripts/cluster/ray-down.sh /tmp/tandem-ray
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster_common;
mod common;

use cluster_common::{metrics, probe_from_n2_without_token, text, wait_no_workers, worker_pid};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
fn a_engine_on_n1_trainer_on_n2_learn_through_the_checkpoint_bridge() {
    // Reloaded in place: a restart per step is a new Ray driver per step (~3 s of Python
    // start-up on a busy 2-core machine); `c_...` restarts workers in their bundles.
    cluster_common::learns_across_two_hosts(
        ("checkpoint", "restart = false"),
        LAUNCHER,
        tandem_run_on_n1,
    );
}

#[test]
#[ignore = "needs a Ray cluster from scripts/cluster/ray-up.sh (TANDEM_RAY_HEAD_PID)"]
fn b_engine_on_n1_trainer_on_n2_learn_through_broadcast_over_tcp() {
    cluster_common::learns_across_two_hosts(("broadcast", ""), LAUNCHER, tandem_run_on_n1);
}

/// Waits (bounded) until the run recorded `steps` steps.
fn wait_steps(run: &Path, child: &mut std::process::Child, steps: usize) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while metrics(run).len() < steps {
        assert!(Instant::now() < deadline, "step {steps} not reached");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGKILLs `role` rank 0's worker process, checking it runs on `node`; its pid.
fn kill_worker(run: &Path, role: &str, node: &str) -> u32 {
    let pid = worker_pid(run, role).unwrap_or_else(|| panic!("the {role}'s log names its pid"));
    let host = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-u", "hostname"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&host.stdout).trim(),
        node,
        "{role} pid {pid} runs on {node}"
    );
    assert!(
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    pid
}

/// The control plane's address, as the trainer's log says it dialed it.
fn control_addr(run: &Path) -> std::net::SocketAddr {
    let log = std::fs::read_to_string(run.join("logs/trainer-0.log")).unwrap();
    log.lines()
        .find_map(|l| l.split("connected to ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.trim_end_matches([',', '.', ';']).parse().ok())
        .unwrap_or_else(|| panic!("the trainer's log names the control address: {log}"))
}

#[test]
#[ignore = "needs a Ray cluster from scripts/cluster/ray-up.sh (TANDEM_RAY_HEAD_PID)"]
fn c_remote_workers_killed_on_their_nodes_are_named_and_replaced_a_tokenless_peer_is_refused() {
    let t = tempfile::tempdir().unwrap();
    // Reload in place: the engine process stays the same from step to step.
    let job = cluster_common::job(t.path(), "checkpoint", 8, "restart = false", LAUNCHER);
    let run = t.path().join("run");
    let mut child = tandem_run_on_n1(&job)
        .current_dir(t.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_steps(&run, &mut child, 2);
    probe_from_n2_without_token(control_addr(&run));
    let engine = kill_worker(&run, "engine", "n1");
    // The trainer dies once the run is past the engine's recovery.
    wait_steps(&run, &mut child, 5);
    let trainer = kill_worker(&run, "trainer", "n2");
    let out = child.wait_with_output().unwrap();
    let err = text(&out);
    assert!(out.status.success(), "{err}");
    for (what, pid) in [
        ("engine rank 0 (in Ray bundle 0 on 10.77.1.1", engine),
        ("trainer rank 0 (in Ray bundle 1 on 10.77.1.2", trainer),
    ] {
        assert!(
            err.lines().any(|l| l.contains("ERROR")
                && l.contains(what)
                && l.contains("killed by signal 9")),
            "no error line names {what}, killed (pid {pid}): {err}"
        );
    }
    assert!(
        err.lines().any(|l| l.contains("WARN")
            && l.contains("rejected peer 10.77.1.2:")
            && l.contains("wrong run token")),
        "the refused peer from n2 is not logged: {err}"
    );
    let m = metrics(&run);
    let steps: Vec<u64> = m.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (1..=8).collect::<Vec<u64>>(), "every step once");
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert_eq!(events.matches("\"recovered\"").count(), 2, "{events}");
    assert_eq!(m[7]["hosts"]["engine-0"], "n1 (10.77.1.1)");
    assert_eq!(m[7]["hosts"]["trainer"], "n2 (10.77.1.2)");
    assert_eq!(wait_no_workers(&run), Vec::<String>::new());
}

#[test]
#[ignore = "child entry point: run on n2 by c_remote_workers_killed_..."]
fn token_child() {
    cluster_common::token_child();
}
