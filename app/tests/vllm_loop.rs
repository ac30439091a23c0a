//! The mixed pair `vllm` engine + `native` trainer through the real RL loop (`tandem run`) with
//! the `checkpoint` bridge: a short run of `examples/vllm-native-checkpoint.toml`, and a vLLM
//! server killed during a run; and a job without a Python for vLLM.
//!
//! Needs a built `libtandem_vllm.so`; the real-server test also the venv of
//! `scripts/setup-python.sh`: it is `#[ignore]`d and, when run with `--ignored`, fails at once
//! if `TANDEM_PYTHON` is unset (never a silent pass). At most one vLLM server runs at a time (the plugin stops its server
//! before it starts one on a new checkpoint). Run:
//!
//! ```text
//! cargo build -p tandem-plugin-vllm
//! TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1) \
//!   cargo test -p tandem --test vllm_loop -- --ignored --test-threads=1
//! ```

#![allow(clippy::unwrap_used)]

mod common;
mod rl_common;

use rl_common::{OutputText, wait_output};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn python() -> String {
    common::python_env("vllm_loop")
}

/// A scratch dir holding `examples/job.toml` (the example, verbatim: its `../models/tiny` is
/// created from the preset by the run) and `plugins/` with only `libtandem_vllm.so`.
struct Scratch {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    job: PathBuf,
    plugins: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::create_dir_all(dir.join("examples")).unwrap();
        let job = dir.join("examples/job.toml");
        std::fs::copy(
            common::workspace_root().join("examples/vllm-native-checkpoint.toml"),
            &job,
        )
        .unwrap();
        let so = common::cdylib("tandem_vllm");
        let plugins = common::plugin_dir(&[(&so, "libtandem_vllm.so")]);
        Scratch {
            _tmp: tmp,
            dir,
            job,
            plugins,
        }
    }

    /// `tandem run examples/job.toml --steps N --output-dir RUN` in the background.
    fn spawn(&self, steps: u32, run: &Path) -> Child {
        Command::new(rl_common::tandem_bin())
            .arg("run")
            .arg(&self.job)
            .args(["--steps", &steps.to_string(), "--output-dir"])
            .arg(run)
            .env("TANDEM_PYTHON", python())
            .env("TANDEM_PLUGIN_PATH", self.plugins.path())
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Pids of the vLLM API servers started for this scratch dir (their model or tokenizer
    /// path lies under it), from /proc.
    fn servers(&self) -> Vec<i32> {
        let root = self.dir.to_string_lossy().into_owned();
        rl_common::processes()
            .into_iter()
            .filter(|(_, args)| {
                args.iter()
                    .any(|a| a == "vllm.entrypoints.openai.api_server")
                    && args.iter().any(|a| a.starts_with(&root))
            })
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Every process whose command line names this scratch dir (servers, their engine-core
    /// children, workers) is gone within `limit`; otherwise they are killed and the test fails.
    fn assert_no_leftovers(&self, limit: Duration) {
        let root = self.dir.to_string_lossy().into_owned();
        let find = || -> Vec<(i32, String)> {
            rl_common::processes()
                .into_iter()
                .map(|(pid, args)| (pid, args.join(" ")))
                .filter(|(_, text)| text.contains(&root))
                .collect()
        };
        let start = Instant::now();
        while start.elapsed() < limit {
            if find().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let left = find();
        for (pid, _) in &left {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        panic!("processes left behind after the run: {left:?}");
    }
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The run's stderr carries exactly one `error:` line and no panic; returns that line.
fn one_error_line(err: &str) -> String {
    assert!(!err.contains("panicked"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line expected: {err}");
    errors[0].to_string()
}

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh) and real vLLM servers"]
fn vllm_engine_and_native_trainer_run_the_loop_and_a_dead_server_stops_it_cleanly() {
    let _ = python();
    let s = Scratch::new();

    // 1. The example, 2 steps: completes, a metrics line per step, the last synced version is
    //    the one the engine reported.
    let run = s.dir.join("run");
    let t = Instant::now();
    let mut child = s.spawn(2, &run);
    let out = wait_output(&mut child, Duration::from_secs(900));
    eprintln!("vllm loop: 2-step run {:.1} s", t.elapsed().as_secs_f64());
    assert!(out.status.success(), "{}", out.stderr_text());
    let metrics = lines(&run.join("metrics.jsonl"));
    let steps: Vec<u64> = metrics
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2], "{metrics:?}");
    for m in &metrics {
        for k in ["reward_mean", "loss", "step_s"] {
            assert!(m[k].as_f64().unwrap().is_finite(), "{k}: {m}");
        }
    }
    let version = metrics[1]["weight_version"].as_u64().unwrap();
    assert!(
        version >= 1,
        "no step trained, so nothing was synced (rewards without signal?): {metrics:?}"
    );
    let events = lines(&run.join("events.jsonl"));
    let syncs: Vec<&str> = events
        .iter()
        .filter(|e| e["op"] == "sync")
        .map(|e| e["detail"].as_str().unwrap())
        .collect();
    assert!(
        syncs
            .last()
            .is_some_and(|d| d.starts_with(&format!("version {version} "))),
        "{syncs:?}"
    );
    // The engine applied the checkpoint itself (the host restarted nothing) and reported the
    // version back (the bridge checks every engine's report); the plugin's default reloads in
    // place, so one server served the whole run.
    assert!(
        syncs.iter().all(|d| d.contains("restarted false")),
        "{syncs:?}"
    );
    assert!(
        run.join(format!("weights/v{version}/config.json"))
            .is_file()
    );
    let engine_log = read(&run.join("logs/engine-0.log"));
    assert_eq!(
        engine_log.matches("starting vLLM for rank 0").count(),
        1,
        "{engine_log}"
    );
    s.assert_no_leftovers(Duration::from_secs(30));

    // 2. Server dies mid-run: kill the vLLM server once it serves (and any server of this
    //    run that comes up after, should the kill race a checkpoint restart: then the new
    //    server dies during its start-up). The run stops
    //    with exit code 1 and one error line naming the engine and its server.
    let run = s.dir.join("run-killed");
    let mut child = s.spawn(20, &run);
    // The plugin logs this once `/health` answered (vLLM's own "startup complete" comes
    // earlier, while the plugin still waits).
    let log = run.join("logs/engine-0.log");
    let t = Instant::now();
    let mut killed = Vec::new();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            t.elapsed() < Duration::from_secs(900),
            "the run neither served nor stopped"
        );
        let serving =
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("vLLM rank 0 healthy at"));
        if serving {
            for pid in s.servers() {
                if !killed.contains(&pid) {
                    eprintln!(
                        "vllm loop: killing server pid {pid} after {:.1} s",
                        t.elapsed().as_secs_f64()
                    );
                    rl_common::kill9(pid);
                    killed.push(pid);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // `wait_output` returns at once for an exited child and collects its output.
    let out = wait_output(&mut child, Duration::from_secs(5));
    assert!(
        !killed.is_empty(),
        "no server was killed: {}",
        out.stderr_text()
    );
    assert_eq!(status.code(), Some(1), "{}", out.stderr_text());
    let err = out.stderr_text();
    let line = one_error_line(&err);
    eprintln!("vllm loop: {line}");
    assert!(line.contains("engine rank 0"), "{line}");
    assert!(
        line.contains("engine `vllm`: server (pid")
            && (line.contains("died") || line.contains("exited during start-up"))
            && line.contains("SIGKILL"),
        "{line}"
    );
    // The run directory is intact: job, state, every event and metrics line parses, the logs
    // are there.
    for f in [
        "job.toml",
        "run.json",
        "logs/engine-0.log",
        "logs/vllm-0.log",
    ] {
        assert!(run.join(f).is_file(), "{f} missing after the kill");
    }
    let _ = lines(&run.join("events.jsonl"));
    let _ = lines(&run.join("metrics.jsonl"));
    s.assert_no_leftovers(Duration::from_secs(60));
}

/// vLLM not installed, as `tandem run` meets it: no `python` in the options, no
/// `$TANDEM_PYTHON` and no pointer file of `scripts/setup-python.sh` (an empty
/// `TANDEM_VENV_ROOT`, whatever this machine's `~/.cache/tandem` holds). Needs no venv (no
/// server starts), so it runs with the normal tests.
#[test]
fn a_vllm_job_without_python_is_one_line_naming_the_fix() {
    let s = Scratch::new();
    let no_venv = tempfile::tempdir().unwrap();
    // `tandem` without any Python environment to find.
    let tandem = |args: &[&std::ffi::OsStr]| {
        Command::new(rl_common::tandem_bin())
            .args(args)
            .env_remove("TANDEM_PYTHON")
            .env("TANDEM_VENV_ROOT", no_venv.path())
            .env("TANDEM_PLUGIN_PATH", s.plugins.path())
            .current_dir(&s.dir)
            .output()
            .unwrap()
    };
    let run_dir = s.dir.join("run");
    let out = tandem(&[
        "run".as_ref(),
        s.job.as_os_str(),
        "--steps".as_ref(),
        "1".as_ref(),
        "--output-dir".as_ref(),
        run_dir.as_os_str(),
    ]);
    assert!(!out.status.success(), "{}", out.stderr_text());
    let err = out.stderr_text();
    let line = one_error_line(&err);
    assert!(
        line.contains("engine `vllm`")
            && line.contains("TANDEM_PYTHON")
            && line.contains("scripts/setup-python.sh")
            && line.contains("no pointer file"),
        "{line}"
    );
    // Refused before anything starts, and `tandem check` says the same.
    assert!(!run_dir.exists(), "the run dir was created");
    let check = tandem(&["check".as_ref(), s.job.as_os_str()]);
    assert_eq!(check.status.code(), Some(2), "{}", check.stderr_text());
    assert_eq!(one_error_line(&check.stderr_text()), line);
    s.assert_no_leftovers(Duration::from_secs(30));
}
