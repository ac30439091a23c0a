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

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tandem_control::{ControlServer, Role};

/// The login node's address on the nodes' bridge.
const LOGIN: &str = "10.77.1.254";
/// The entry point a node runs for the token test.
const CHILD_ENV: &str = "TANDEM_CLUSTER_CHILD_ADDR";

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

/// The quickstart task, engine on n1 and trainer on n2 (disaggregated), through `bridge`.
fn job(dir: &Path, bridge: &str, steps: u32, bridge_options: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "cluster"
output_dir = "run"
steps = {steps}
seed = 0
save_every = 0
max_restarts = 3

[placement]
mode = "disaggregated"
devices = ["cpu"]

[model]
path = "{model}"
init_preset = "tiny"
warm_start_steps = 60

[engine]
plugin = "native"

[engine.options]
max_batch = 64
max_seq_len = 64

[trainer]
plugin = "native"

[bridge]
mode = "{bridge}"

[bridge.options]
{bridge_options}

[algorithm]
prompts_per_step = 16
group_size = 8
max_tokens = 4
temperature = 1.0
learning_rate = 0.0003

[task]
kind = "arithmetic"

[task.options]
max_operand = 3
reward = "exact"

[launcher]
kind = "slurm"
advertise = "{LOGIN}"
engine_nodes = ["n1"]
trainer_nodes = ["n2"]
"#,
        model = dir.join("model").display(),
    );
    let path = dir.join(format!("{bridge}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Processes of this run's workers still alive, on any node (all nodes share this machine's
/// process table; their command lines name the run directory's worker specs).
fn leftover_workers(run: &Path) -> Vec<String> {
    let specs = run.join("workers").display().to_string();
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(" worker ") && cmd.contains(&specs) {
            left.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
        }
    }
    left
}

/// Waits (bounded) until no worker of the run is left; what is left after 30 s.
fn wait_no_workers(run: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = leftover_workers(run);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn learns_across_two_hosts(bridge: &str) {
    let t = tempfile::tempdir().unwrap();
    let job = job(t.path(), bridge, 20, "");
    let out = tandem()
        .arg("run")
        .arg(&job)
        .current_dir(t.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{bridge}: {}", text(&out));
    let run = t.path().join("run");
    let m = metrics(&run);
    assert_eq!(m.len(), 20, "{bridge}: one line per step");
    for line in &m {
        assert_eq!(line["hosts"]["engine-0"], "n1 (10.77.1.1)", "{line}");
        assert_eq!(line["hosts"]["trainer"], "n2 (10.77.1.2)", "{line}");
        // Memory figures come from /proc of this machine: none for workers srun runs.
        assert_eq!(line["rss"], serde_json::json!({}), "{line}");
    }
    let mean = |ls: &[Value]| {
        ls.iter()
            .map(|l| l["reward_mean"].as_f64().unwrap())
            .sum::<f64>()
            / ls.len() as f64
    };
    let (first, last) = (mean(&m[..5]), mean(&m[15..]));
    assert!(
        last > first,
        "{bridge}: mean reward {first:.3} over steps 1-5, {last:.3} over 16-20"
    );
    assert_eq!(wait_no_workers(&run), Vec::<String>::new());
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

/// The worker pid the engine's log names (`engine rank 0 (pid N) connected to ...`), newest.
fn engine_pid(run: &Path) -> Option<u32> {
    let log = std::fs::read_to_string(run.join("logs/engine-0.log")).ok()?;
    log.lines()
        .rev()
        .find_map(|l| l.split("engine rank 0 (pid ").nth(1))
        .and_then(|rest| rest.split(')').next())
        .and_then(|p| p.parse().ok())
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
    let pid = engine_pid(&run).expect("the engine's log names its pid");
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
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let addr = addr.parse().unwrap();
    let e = tandem_control::connect(
        addr,
        "not-the-run-token",
        Role::Engine,
        0,
        1,
        Duration::from_secs(10),
    )
    .unwrap_err();
    println!("refused: {e}");
    assert!(e.to_string().contains("wrong run token"), "{e}");
}

#[test]
#[ignore = "needs a Slurm cluster from scripts/cluster/slurm-up.sh (its network namespaces)"]
fn d_a_connection_from_n2_without_the_token_is_refused() {
    let _ = slurm_conf();
    let server = ControlServer::bind(format!("{LOGIN}:0").parse().unwrap()).unwrap();
    let out = Command::new("nsenter")
        .arg("--net=/run/netns/tnd-n2")
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "token_child", "--nocapture"])
        .env(CHILD_ENV, server.local_addr().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out));
    assert!(stdout.contains("refused: "), "{stdout}");
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
