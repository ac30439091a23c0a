//! Shared fixtures of the RL-loop tests: a scratch directory with a tiny model, job files,
//! running `tandem`, reading what a run wrote, and finding / killing its workers.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `tandem` binary under test.
pub fn tandem_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tandem")
}

/// Settings of a test job.
#[derive(Clone)]
pub struct JobOpts {
    /// Extra lines of `[run]`.
    pub extra_run: String,
    pub engines: u32,
    pub steps: u32,
    pub save_every: u32,
    pub prompts: u32,
    pub group: u32,
    pub max_tokens: u32,
    pub bridge: String,
    /// Lines of `[bridge.options]`.
    pub bridge_options: String,
    pub placement: String,
    pub extra_engine: String,
    pub extra_trainer: String,
    pub learning_rate: f32,
    /// Extra lines of `[algorithm]`.
    pub extra_algorithm: String,
    pub task_options: String,
    pub model: Option<PathBuf>,
    /// Sections after `[task.options]` (e.g. `[eval]`).
    pub extra_sections: String,
}

impl Default for JobOpts {
    fn default() -> Self {
        JobOpts {
            extra_run: String::new(),
            engines: 1,
            steps: 2,
            save_every: 0,
            prompts: 4,
            group: 4,
            max_tokens: 4,
            bridge: "checkpoint".into(),
            bridge_options: String::new(),
            placement: "colocate".into(),
            extra_engine: String::new(),
            extra_trainer: String::new(),
            learning_rate: 1e-3,
            extra_algorithm: String::new(),
            // Partial credit: even a random model's rollouts carry signal, so steps train.
            task_options: "max_operand = 3\nreward = \"partial\"\n".into(),
            model: None,
            extra_sections: String::new(),
        }
    }
}

/// A temporary directory holding a tiny model, job files and run directories.
pub struct Scratch {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
}

pub trait OutputText {
    fn stderr_text(&self) -> String;
    fn stdout_text(&self) -> String;
}

impl OutputText for Output {
    fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

impl Scratch {
    /// A scratch directory with `model/` = a fresh tiny preset model.
    pub fn new() -> Scratch {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let out = Command::new(tandem_bin())
            .args(["model", "init", "--preset", "tiny", "--out"])
            .arg(dir.join("model"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", out.stderr_text());
        Scratch { _tmp: tmp, dir }
    }

    /// A scratch directory whose `model/` was warm-started (20 supervised steps on a+b over
    /// 0..=3): its rollouts are digits, so partial rewards vary and every step trains.
    pub fn warm() -> Scratch {
        let t = Scratch::new();
        let init = t.dir.join("model");
        let warm = t.dir.join("model-warm");
        let out = t.tandem(&[
            "model",
            "sft",
            "--model",
            init.to_str().unwrap(),
            "--out",
            warm.to_str().unwrap(),
            "--steps",
            "20",
            "--task-options",
            "max_operand = 3",
        ]);
        assert!(out.status.success(), "{}", out.stderr_text());
        std::fs::remove_dir_all(&init).unwrap();
        std::fs::rename(&warm, &init).unwrap();
        t
    }

    /// Writes `job.toml` and returns its path.
    pub fn job(&self, o: &JobOpts) -> PathBuf {
        let model = o.model.clone().unwrap_or_else(|| self.dir.join("model"));
        let text = format!(
            r#"
[run]
name = "test"
output_dir = "run"
steps = {steps}
seed = 1
save_every = {save_every}
{extra_run}
[placement]
mode = "{placement}"

[model]
path = "{model}"

[engine]
plugin = "native"
ranks = {engines}
{extra_engine}
[engine.options]
max_batch = 64
max_seq_len = 64

[trainer]
plugin = "native"
{extra_trainer}
[bridge]
mode = "{bridge}"

[bridge.options]
{bridge_options}

[algorithm]
prompts_per_step = {prompts}
group_size = {group}
max_tokens = {max_tokens}
learning_rate = {lr}
{extra_algorithm}

[task]
kind = "arithmetic"

[task.options]
{task_options}
{extra_sections}
"#,
            steps = o.steps,
            save_every = o.save_every,
            extra_run = o.extra_run,
            placement = o.placement,
            model = model.display(),
            engines = o.engines,
            extra_engine = o.extra_engine,
            extra_trainer = o.extra_trainer,
            bridge = o.bridge,
            bridge_options = o.bridge_options,
            prompts = o.prompts,
            group = o.group,
            max_tokens = o.max_tokens,
            lr = o.learning_rate,
            extra_algorithm = o.extra_algorithm,
            task_options = o.task_options,
            extra_sections = o.extra_sections,
        );
        let path = self.dir.join("job.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `tandem <args>`, waited for.
    pub fn tandem(&self, args: &[&str]) -> Output {
        Command::new(tandem_bin())
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap()
    }

    /// `tandem run JOB <extra>`, waited for.
    pub fn run(&self, job: &Path, extra: &[&str]) -> Output {
        let mut args = vec!["run", job.to_str().unwrap()];
        args.extend(extra);
        self.tandem(&args)
    }

    /// `tandem run JOB <extra>` in the background (output captured).
    pub fn spawn(&self, job: &Path, extra: &[&str]) -> Child {
        Command::new(tandem_bin())
            .arg("run")
            .arg(job)
            .args(extra)
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn lines(&self, file: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.join("run").join(file))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// `run/events.jsonl`.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.lines("events.jsonl")
    }

    /// `run/metrics.jsonl`.
    pub fn metrics(&self) -> Vec<serde_json::Value> {
        self.lines("metrics.jsonl")
    }

    /// Number of complete metrics lines so far.
    pub fn metrics_lines(&self) -> usize {
        self.metrics().len()
    }
}

/// The `step` of every metrics line, in file order.
pub fn steps_of(metrics: &[serde_json::Value]) -> Vec<u64> {
    metrics
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect()
}

/// Every line of a JSON-lines file (none when it is absent).
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Indices of the events of `step` with operation `op`.
pub fn positions(events: &[serde_json::Value], step: u64, op: &str) -> Vec<usize> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["step"].as_u64() == Some(step) && e["op"] == op)
        .map(|(i, _)| i)
        .collect()
}

pub fn min(v: &[usize]) -> usize {
    *v.iter().min().unwrap()
}

pub fn max(v: &[usize]) -> usize {
    *v.iter().max().unwrap()
}

/// Polls `f` until it holds; panics after `limit`.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for `child` (killing it after `limit`) and collects its output.
pub fn wait_output(child: &mut Child, limit: Duration) -> Output {
    let start = Instant::now();
    let mut stderr = child.stderr.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("`tandem run` did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

/// The pid of the worker `role` rank `rank` of the run in `run_dir` (from /proc).
pub fn worker_pid(run_dir: &Path, role: &str, rank: u32) -> Option<i32> {
    let spec = std::path::absolute(run_dir)
        .unwrap()
        .join("workers")
        .join(format!("{role}-{rank}.json"));
    let spec = spec.to_str().unwrap().to_string();
    processes()
        .into_iter()
        .find(|(_, args)| args.iter().any(|a| a == "worker") && args.contains(&spec))
        .map(|(pid, _)| pid)
}

/// Every process's pid and command line (split at its NULs, so the last item is empty), from
/// /proc; processes gone before their command line is read are left out.
pub fn processes() -> Vec<(i32, Vec<String>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        out.push((pid, args));
    }
    out
}

/// SIGKILLs the controller `child` of the run in `run_dir`, then waits until each of its
/// workers `(role, rank)` has noticed its controller is gone and exited.
pub fn kill_controller(child: &mut Child, run_dir: &Path, workers: &[(&str, u32)]) {
    let pids: Vec<i32> = workers
        .iter()
        .map(|(role, rank)| worker_pid(run_dir, role, *rank).expect("a worker pid"))
        .collect();
    kill9(child.id() as i32);
    let _ = wait_output(child, Duration::from_secs(30));
    wait_for(Duration::from_secs(60), || {
        pids.iter()
            .all(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    });
}

/// SIGKILL.
pub fn kill9(pid: i32) {
    let ok = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -9 {pid}");
}

/// The newest complete checkpoint of a run directory.
pub fn newest_checkpoint(run_dir: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("step-")
                && p.join("tandem_loop_state.json").is_file()
        })
        .collect();
    v.sort();
    v.pop().unwrap()
}

/// The median of `metrics[step - 1][field][worker]` over `steps` (1-based): a memory figure
/// over a window, since one sample of a heap moves by a few MB with fragmentation and load.
pub fn median_of(
    metrics: &[serde_json::Value],
    field: &str,
    worker: &str,
    steps: std::ops::RangeInclusive<usize>,
) -> f64 {
    let mut v: Vec<f64> = steps
        .map(|s| metrics[s - 1][field][worker].as_f64().unwrap())
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
