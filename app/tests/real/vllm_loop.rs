//! The mixed pair `vllm` engine + `native` trainer through the real RL loop (`tandem run`) with
//! the `checkpoint` bridge: a short run of `examples/vllm-native-checkpoint.toml` whose vLLM
//! server is killed after the first step (the loop restarts the engine and the run finishes);
//! and a job without a Python for vLLM.
//!
//! Needs a built `libtandem_vllm.so`; the real-server test also the venv of
//! `scripts/setup-python.sh`: it is `#[ignore]`d and, when run with `--ignored`, fails at once
//! if `TANDEM_PYTHON` is unset (never a silent pass). At most one vLLM server runs at a time (the plugin stops its server
//! before it starts one on a new checkpoint). Run:
//!
//! ```text
//! cargo build -p tandem-plugin-vllm
//! TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1) \
//!   cargo test -p tandem --test real -- --ignored --test-threads=1 vllm_loop::
//! ```

#![allow(clippy::unwrap_used)]

use crate::common;

use crate::common::rl::{OutputText, wait_output};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Steps of the run whose server is killed: one clean step, the kill, steps after it.
const STEPS: u32 = 4;

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
        Command::new(crate::common::rl::tandem_bin())
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
        crate::common::rl::processes()
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
            crate::common::rl::processes()
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
fn vllm_engine_and_native_trainer_run_the_loop_and_survive_a_dead_server() {
    let _ = python();
    let s = Scratch::new();

    // The example, 4 steps; step 1 runs on the first server, which is then SIGKILLed once
    // (only that server: killing its replacement too would be a crash loop). The engine
    // worker's plugin reports the dead server as `unavailable`, the loop restarts engine-0 (a
    // new worker and server on the job's model, brought to the last shipped checkpoint) and
    // the run finishes on its own. One run serves both checks (a clean step, a recovery): a
    // vLLM start-up is the dearest thing here.
    let run = s.dir.join("run");
    let metrics_path = run.join("metrics.jsonl");
    let t = Instant::now();
    let mut child = s.spawn(STEPS, &run);
    // The watcher kills; this thread drains the run's output (a full pipe would stall it).
    let limit = Duration::from_secs(1500);
    let done = AtomicBool::new(false);
    let (out, killed) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            while !done.load(Ordering::Relaxed) && t.elapsed() < limit {
                // A whole line (a line being written is no step yet).
                let stepped =
                    std::fs::read_to_string(&metrics_path).is_ok_and(|m| m.contains('\n'));
                if stepped {
                    let servers = s.servers();
                    assert_eq!(servers.len(), 1, "one server serves the run: {servers:?}");
                    eprintln!(
                        "vllm loop: killing server pid {} after {:.1} s",
                        servers[0],
                        t.elapsed().as_secs_f64()
                    );
                    crate::common::rl::kill9(servers[0]);
                    return Some(servers[0]);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        });
        let out = wait_output(&mut child, limit);
        done.store(true, Ordering::Relaxed);
        (out, watcher.join().unwrap())
    });
    let status = out.status;
    eprintln!(
        "vllm loop: {STEPS}-step run with a server killed {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let err = out.stderr_text();
    let killed = killed.unwrap_or_else(|| panic!("no server was killed: {err}"));
    assert!(status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // Every step recorded exactly once, with finite figures; something trained.
    let metrics = lines(&metrics_path);
    let steps: Vec<u64> = metrics
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(
        steps,
        (1..=u64::from(STEPS)).collect::<Vec<_>>(),
        "{metrics:?}"
    );
    for m in &metrics {
        for k in ["reward_mean", "loss", "step_s"] {
            assert!(m[k].as_f64().unwrap().is_finite(), "{k}: {m}");
        }
    }
    let versions: Vec<u64> = metrics
        .iter()
        .map(|m| m["weight_version"].as_u64().unwrap())
        .collect();
    assert!(versions.windows(2).all(|w| w[1] >= w[0]), "{versions:?}");
    let version = *versions.last().unwrap();
    assert!(
        version >= 1,
        "no step trained, so nothing was synced (rewards without signal?): {metrics:?}"
    );
    assert_eq!(
        metrics.last().unwrap()["restarts"].as_u64(),
        Some(1),
        "{metrics:?}"
    );

    // Events: the death and restart of engine-0, after step 1 and before the last step; the
    // replacement serves what was shipped before the death; every sync ships the version the
    // trainer reached, applied in place (the bridge checks every engine's report), the last
    // one what the last step recorded.
    let events = lines(&run.join("events.jsonl"));
    let at = |op: &str| -> Vec<usize> {
        events
            .iter()
            .enumerate()
            .filter(|(_, e)| e["op"] == op)
            .map(|(i, _)| i)
            .collect()
    };
    let (deaths, restarts) = (at("death"), at("restart"));
    assert_eq!(deaths.len(), 1, "{events:?}");
    assert_eq!(restarts.len(), 1, "{events:?}");
    let (death, restart) = (&events[deaths[0]], &events[restarts[0]]);
    eprintln!("vllm loop: {death}\nvllm loop: {restart}");
    assert_eq!(death["target"], "engine-0", "{death}");
    assert_eq!(restart["target"], "engine-0", "{restart}");
    assert!(deaths[0] < restarts[0], "{events:?}");
    let died_in = death["step"].as_u64().unwrap();
    assert!((2..=u64::from(STEPS)).contains(&died_in), "{death}");
    let why = death["detail"].as_str().unwrap();
    assert!(
        why.contains(&format!("pid {killed}")) && why.contains("SIGKILL"),
        "{why}"
    );
    assert!(
        at("recovered").iter().any(|&i| i > restarts[0]),
        "{events:?}"
    );
    let syncs: Vec<(usize, u64, &str)> = at("sync")
        .into_iter()
        .map(|i| {
            let d = events[i]["detail"].as_str().unwrap();
            let v = d
                .strip_prefix("version ")
                .unwrap()
                .split(' ')
                .next()
                .unwrap();
            (i, v.parse().unwrap(), d)
        })
        .collect();
    // Each sync ships what its step trained (the metrics line's version).
    for (i, v, _) in &syncs {
        let step = events[*i]["step"].as_u64().unwrap() as usize;
        assert_eq!(Some(*v), versions.get(step - 1).copied(), "{}", events[*i]);
    }
    let before = syncs
        .iter()
        .filter(|(i, ..)| *i < deaths[0])
        .map(|(_, v, _)| *v)
        .max();
    let restart_version = restart["detail"]
        .as_str()
        .unwrap()
        .split("version ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no version in {restart}"));
    // Restored to the last shipped version, or (death after the step trained) left on the
    // job's model for the step's sync to bring up to date.
    assert!(
        before.is_none_or(|b| restart_version <= b),
        "restarted at version {restart_version}, shipped before {before:?}: {events:?}"
    );
    let after: Vec<u64> = syncs
        .iter()
        .filter(|(i, ..)| *i > restarts[0])
        .map(|(_, v, _)| *v)
        .collect();
    assert!(!after.is_empty(), "no sync after the restart: {events:?}");
    assert!(
        after[0] >= restart_version,
        "{after:?} after version {restart_version}"
    );
    assert!(
        syncs.windows(2).all(|w| w[1].1 > w[0].1),
        "sync versions must go up: {syncs:?}"
    );
    assert_eq!(syncs.last().unwrap().1, version, "{syncs:?}");
    assert!(
        syncs.iter().all(|(.., d)| d.contains("restarted false")),
        "{syncs:?}"
    );
    // Every sync's digest (the st256 of the checkpoint's files) was verified by the engines.
    assert!(
        syncs
            .iter()
            .all(|(.., d)| d.contains("digest st256:") && d.ends_with("verified true")),
        "{syncs:?}"
    );
    assert!(
        run.join(format!("weights/v{version}/config.json"))
            .is_file()
    );
    // Each engine worker started one server (the plugin reloads checkpoints in place); the
    // log is appended to by the replacement.
    let engine_log = read(&run.join("logs/engine-0.log"));
    assert_eq!(
        engine_log.matches("starting vLLM for rank 0").count(),
        2,
        "{engine_log}"
    );
    for f in ["job.toml", "run.json", "logs/vllm-0.log"] {
        assert!(run.join(f).is_file(), "{f} missing after the run");
    }
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
        Command::new(crate::common::rl::tandem_bin())
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
