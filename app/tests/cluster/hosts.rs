//! Shared parts of the two-host tests (`cluster_slurm`, `cluster_ray`): the quickstart job with
//! its engine on n1 and its trainer on n2, its metrics, the workers of a run still alive on
//! any node, and the probe that dials the control plane from n2 without the run token.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tandem_control::Role;

/// The quickstart's model, warm-started once per test process (about 20 s a model on a
/// busy 2-core machine) by a one-step local run, and read by every job of the process.
fn shared_model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = crate::common::process_scratch("cluster-model");
        let job = job_text("checkpoint", 1, "", &dir.join("model"), "");
        let path = dir.join("warm.toml");
        std::fs::write(&path, job).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .arg("run")
            .arg(&path)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "warm start: {}", text(&out));
        dir.join("model")
    })
}

/// The entry point a node runs for the token probe.
pub const CHILD_ENV: &str = "TANDEM_CLUSTER_CHILD_ADDR";

/// The quickstart task, disaggregated, through `bridge`, with the launcher table `launcher`
/// (which puts the engine on n1 and the trainer on n2).
pub fn job(dir: &Path, bridge: &str, steps: u32, bridge_options: &str, launcher: &str) -> PathBuf {
    let text = job_text(bridge, steps, bridge_options, shared_model(), launcher);
    let path = dir.join(format!("{bridge}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The job file's text; the run goes to `run` beside it.
pub fn job_text(
    bridge: &str,
    steps: u32,
    bridge_options: &str,
    model: &Path,
    launcher: &str,
) -> String {
    format!(
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

{launcher}
"#,
        model = model.display(),
    )
}

pub fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Processes of this run's workers still alive, on any node (all nodes share this machine's
/// process table; their command lines name the run directory's worker specs).
pub fn leftover_workers(run: &Path) -> Vec<String> {
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
pub fn wait_no_workers(run: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = leftover_workers(run);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the 20-step job `tandem run` (a command on the controller's host) makes of `job`, and
/// checks it learned with the engine on n1 and the trainer on n2, and left no worker.
pub fn learns_across_two_hosts(
    (bridge, bridge_options): (&str, &str),
    launcher: &str,
    mut tandem_run: impl FnMut(&Path) -> Command,
) {
    let t = tempfile::tempdir().unwrap();
    let job = job(t.path(), bridge, 20, bridge_options, launcher);
    let out = tandem_run(&job).current_dir(t.path()).output().unwrap();
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
    if bridge == "broadcast" {
        // The plan each worker made from the hosts the ranks published at rendezvous: tcp
        // between n1 and n2, no shared memory.
        for role in ["trainer", "engine"] {
            let log = std::fs::read_to_string(run.join(format!("logs/{role}-0.log"))).unwrap();
            let links: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("transport: world rank"))
                .collect();
            assert!(!links.is_empty(), "{role}: no transport link logged: {log}");
            for l in &links {
                assert!(
                    l.ends_with(": tcp") && l.contains(" on n1-") && l.contains(" on n2-"),
                    "{role}: {l}"
                );
            }
        }
    }
    assert_eq!(wait_no_workers(&run), Vec::<String>::new());
}

/// The worker pid `role`'s log names (`engine rank 0 (pid N) connected to ...`), newest.
pub fn worker_pid(run: &Path, role: &str) -> Option<u32> {
    let log = std::fs::read_to_string(run.join(format!("logs/{role}-0.log"))).ok()?;
    let marker = format!("{role} rank 0 (pid ");
    log.lines()
        .rev()
        .find_map(|l| l.split(marker.as_str()).nth(1))
        .and_then(|rest| rest.split(')').next())
        .and_then(|p| p.parse().ok())
}

/// The token probe's side on n2: when [`CHILD_ENV`] names an address, connects there with a
/// wrong token and checks it is refused (a test binary's `token_child` test calls this).
pub fn token_child() {
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

/// Dials `addr` from n2 without the run token (this test binary's `token_child`, run in n2's
/// network namespace) and checks it was refused there.
pub fn probe_from_n2_without_token(addr: std::net::SocketAddr) {
    let out = Command::new("nsenter")
        .arg("--net=/run/netns/tnd-n2")
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "token_child", "--nocapture"])
        .env(CHILD_ENV, addr.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out));
    assert!(stdout.contains("refused: "), "{stdout}");
}

/// Waits (bounded) until the run recorded `steps` steps.
pub fn wait_steps(run: &Path, child: &mut std::process::Child, steps: usize) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while metrics(run).len() < steps {
        assert!(Instant::now() < deadline, "step {steps} not reached");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGKILLs `role` rank 0's worker process, checking it runs on `node`; its pid.
pub fn kill_worker(run: &Path, role: &str, node: &str) -> u32 {
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
pub fn control_addr(run: &Path) -> std::net::SocketAddr {
    let log = std::fs::read_to_string(run.join("logs/trainer-0.log")).unwrap();
    log.lines()
        .find_map(|l| l.split("connected to ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.trim_end_matches([',', '.', ';']).parse().ok())
        .unwrap_or_else(|| panic!("the trainer's log names the control address: {log}"))
}

/// The engine (on n1) and then the trainer (on n2) of an 8-step run SIGKILLed on their
/// nodes: each is named by an error line starting with its `places` entry (`engine rank 0
/// (on node n1`) and replaced; a connection from n2 without the run token is refused and
/// logged; every step is done once, and no worker is left on either node.
pub fn workers_killed_on_their_nodes_are_named_and_replaced(
    launcher: &str,
    mut tandem_run: impl FnMut(&Path) -> Command,
    places: (&str, &str),
) {
    let t = tempfile::tempdir().unwrap();
    // Reload in place: the engine process stays the same from step to step.
    let job = job(t.path(), "checkpoint", 8, "restart = false", launcher);
    let run = t.path().join("run");
    let mut child = tandem_run(&job)
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
    for (what, pid) in [(places.0, engine), (places.1, trainer)] {
        assert!(
            err.lines().any(|l| l.contains("ERROR")
                && l.contains(what)
                // srun reports its task's SIGKILL as status 137; the Ray driver re-raises it.
                && (l.contains("killed by signal 9") || l.contains("exited with status 137"))),
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
