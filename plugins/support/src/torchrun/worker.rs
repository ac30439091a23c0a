//! The torchrun job: writes the embedded Python packages, checks the interpreter, launches
//! `python -m torch.distributed.run --standalone --nproc-per-node N -m <worker package>` as a
//! supervised process group with its output in `<run_dir>/logs/<component>-trainer.log`,
//! accepts rank 0's connection (run token checked), and turns each operation into one
//! request/reply with a deadline. A dead job or a timed-out call marks the worker broken:
//! every later call fails with the same one line instead of hanging.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tandem_plugin_api::{ErrorCode, PluginError};

use super::channel::{Channel, ChannelError};
use super::{Job, PackageFile, SHARED_PACKAGE};
use crate::{Python, Supervised, log_tail};

type Result<T> = std::result::Result<T, PluginError>;

/// Grace between SIGTERM and SIGKILL when the job is stopped.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a polite shutdown request may take.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Where and how the job is launched.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Hugging Face model directory.
    pub model: PathBuf,
    /// Run directory (exports, logs); empty: a temporary directory.
    pub run_dir: String,
    /// `cpu` or `cuda[:i]`.
    pub device: String,
    /// The interpreter of the venv.
    pub python: Python,
    /// Ranks (torchrun `--nproc-per-node`).
    pub ranks: u32,
    /// Torch threads per rank.
    pub threads: u32,
    /// The worker's own options (`cfg["options"]` on the Python side).
    pub options: Value,
    /// Seconds from launch until rank 0 connects.
    pub startup_timeout_s: f64,
    /// Seconds one operation may take.
    pub call_timeout_s: f64,
    /// Seconds a collective may wait for a peer rank (gloo / NCCL timeout).
    pub collective_timeout_s: f64,
}

/// A running torchrun job and its channel to rank 0.
pub struct Worker {
    job: &'static Job,
    proc: Supervised,
    chan: Channel,
    log: PathBuf,
    call_timeout: Duration,
    broken: Option<PluginError>,
    /// Process id of rank 0 (from its hello).
    pub rank0_pid: u32,
    /// Ranks of the job.
    pub ranks: u32,
}

fn unavailable(msg: String) -> PluginError {
    PluginError::new(ErrorCode::Unavailable, msg)
}

fn run_token(what: &str) -> Result<String> {
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .map_err(|e| PluginError::io(format!("{what}: reading /dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Checks that `python` runs and finds the job's modules (module lookup only: a second, not
/// an import of torch).
fn check_python(job: &Job, python: &Python) -> Result<()> {
    let what = job.what();
    let wanted: Vec<String> = job.needs.iter().map(|m| format!("'{m}'")).collect();
    let probe = format!(
        "import importlib.util as u, sys\n\
         def has(m):\n    try:\n        return u.find_spec(m) is not None\n    except ImportError:\n        return False\n\
         miss = [m for m in ({},) if not has(m)]\n\
         print(' '.join(miss)); sys.exit(3 if miss else 0)",
        wanted.join(", ")
    );
    let help = "create the venv with `bash scripts/setup.sh` (scripts/setup-python.sh) and point \
                options.python or $TANDEM_PYTHON at its python, or unset them to use the one it \
                records";
    let shown = format!("`{}` (from {})", python.path.display(), python.source);
    match Command::new(&python.path)
        .args(["-c", &probe])
        .stdin(Stdio::null())
        .output()
    {
        Err(e) => Err(PluginError::invalid_input(format!(
            "{what}: cannot run Python {shown}: {e}"
        ))
        .with_help(help)),
        Ok(o) if o.status.code() == Some(3) => Err(PluginError::invalid_input(format!(
            "{what}: Python {shown} lacks {}",
            String::from_utf8_lossy(&o.stdout).trim()
        ))
        .with_help(help)),
        Ok(o) if !o.status.success() => Err(PluginError::invalid_input(format!(
            "{what}: Python {shown} failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ))
        .with_help(help)),
        Ok(_) => Ok(()),
    }
}

/// Writes the packages (`tandem_torchrun` and the job's worker) into `dir`.
fn write_packages(what: &str, dir: &Path, packages: &[(&str, &[PackageFile])]) -> Result<()> {
    for (module, files) in packages {
        let pkg = dir.join(module);
        std::fs::create_dir_all(&pkg)
            .map_err(|e| PluginError::io(format!("{what}: creating {}: {e}", pkg.display())))?;
        for (name, text) in *files {
            let path = pkg.join(name);
            std::fs::write(&path, text)
                .map_err(|e| PluginError::io(format!("{what}: writing {}: {e}", path.display())))?;
        }
    }
    Ok(())
}

impl Worker {
    /// Launches the job and waits for rank 0's hello.
    pub fn launch(job: &'static Job, l: &Launch) -> Result<Worker> {
        let what = job.what();
        let name = job.component;
        if !l.model.join("config.json").is_file() {
            return Err(PluginError::invalid_input(format!(
                "{what}: model directory {} has no config.json",
                l.model.display()
            ))
            .with_help("point [model] path at a Hugging Face model directory"));
        }
        check_python(job, &l.python)?;
        let base = if l.run_dir.is_empty() {
            std::env::temp_dir().join(format!("tandem-{name}-{}", std::process::id()))
        } else {
            PathBuf::from(&l.run_dir)
        };
        let pkg_dir = base.join(format!("{name}-worker"));
        write_packages(&what, &pkg_dir, &[SHARED_PACKAGE, job.package])?;
        let logs = base.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| PluginError::io(format!("{what}: creating {}: {e}", logs.display())))?;
        let log = logs.join(format!("{name}-trainer.log"));
        let out = std::fs::File::create(&log)
            .map_err(|e| PluginError::io(format!("{what}: creating {}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| PluginError::io(format!("{what}: log file: {e}")))?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| PluginError::io(format!("{what}: listening on loopback: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| PluginError::io(format!("{what}: {e}")))?;
        let token = run_token(&what)?;
        let device = if l.device.starts_with("cuda") {
            "cuda"
        } else {
            "cpu"
        };
        let cfg = json!({
            "model_path": l.model.display().to_string(),
            "run_dir": base.display().to_string(),
            "device": device,
            "threads": l.threads,
            "collective_timeout_s": l.collective_timeout_s,
            "options": l.options,
        });
        let mut cmd = Command::new(&l.python.path);
        cmd.args([
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
        ])
        .arg(format!("--nproc-per-node={}", l.ranks))
        .args(["--max-restarts", "0", "--monitor-interval", "0.5"])
        .args(["-m", job.package.0])
        .current_dir(&pkg_dir)
        .env("PYTHONPATH", &pkg_dir)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONWARNINGS", "ignore")
        .env("OMP_NUM_THREADS", l.threads.to_string())
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("TANDEM_TORCHRUN_CONFIG", cfg.to_string())
        .env("TANDEM_TORCHRUN_ADDR", addr.to_string())
        .env("TANDEM_TORCHRUN_TOKEN", &token)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
        let proc =
            Supervised::spawn(cmd, &format!("{name}-supervisor"), STOP_GRACE).map_err(|e| {
                PluginError::invalid_input(format!(
                    "{what}: cannot start `{}` (from {}): {e}",
                    l.python.path.display(),
                    l.python.source
                ))
            })?;
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(l.startup_timeout_s);
        let fail = |proc: &Supervised, how: String| {
            unavailable(format!(
                "{what}: torchrun (pid {}, {} ranks) {how}: {} (log: {})",
                proc.pid,
                l.ranks,
                log_tail(&log, 2),
                log.display()
            ))
        };
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(PluginError::io(format!("{what}: accept: {e}"))),
            }
            if let Some(status) = proc.exited() {
                return Err(fail(&proc, format!("exited during start-up ({status})")));
            }
            if Instant::now() > deadline {
                return Err(fail(
                    &proc,
                    format!("did not connect within {} s", l.startup_timeout_s),
                )
                .with_help("raise options.startup_timeout_s or read the log"));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut chan = stream
            .set_nonblocking(false)
            .and_then(|()| Channel::new(stream))
            .map_err(|e| PluginError::io(format!("{what}: channel: {e}")))?;
        let hello = chan
            .recv(deadline, &|| proc.exited())
            .map_err(|e| fail(&proc, format!("sent no hello ({e})")))?;
        if hello.get("token").and_then(Value::as_str) != Some(token.as_str()) {
            return Err(PluginError::runtime(format!(
                "{what}: a process without the run token connected to the control port"
            )));
        }
        let rank0_pid = hello.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
        Ok(Worker {
            job,
            proc,
            chan,
            log,
            call_timeout: Duration::from_secs_f64(l.call_timeout_s),
            broken: None,
            rank0_pid,
            ranks: l.ranks,
        })
    }

    /// Process id of the torchrun agent (leader of the job's process group).
    pub fn agent_pid(&self) -> u32 {
        self.proc.pid
    }

    /// Runs `op` on every rank; rank 0's value, or one error naming the failing rank with
    /// the last lines of its traceback.
    pub fn call(&mut self, op: &str, args: Value) -> Result<Value> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if let Some(status) = self.proc.exited() {
            return Err(self.break_with(self.dead(op, &status)));
        }
        let request = json!({"op": op, "args": args});
        let deadline = Instant::now() + self.call_timeout;
        let proc = &self.proc;
        let reply = self
            .chan
            .send(&request)
            .and_then(|()| self.chan.recv(deadline, &|| proc.exited()));
        let reply = match reply {
            Ok(r) => r,
            Err(ChannelError::Timeout) => {
                let e = PluginError::new(
                    ErrorCode::Timeout,
                    format!(
                        "{}: {op} did not finish within {} s; the torchrun job was stopped (log: {})",
                        self.job.what(),
                        self.call_timeout.as_secs(),
                        self.log.display()
                    ),
                )
                .with_help("raise options.call_timeout_s, or read the log for a stuck rank");
                self.proc.stop();
                return Err(self.break_with(e));
            }
            Err(ChannelError::Dead(status)) => return Err(self.break_with(self.dead(op, &status))),
            Err(e) => {
                let status = self.proc.exited().unwrap_or_else(|| e.to_string());
                self.proc.stop();
                return Err(self.break_with(self.dead(op, &status)));
            }
        };
        if let Some(v) = reply.get("ok") {
            return Ok(v.clone());
        }
        Err(python_error(
            &self.job.what(),
            op,
            reply.get("error"),
            &self.log,
        ))
    }

    fn dead(&self, op: &str, status: &str) -> PluginError {
        unavailable(format!(
            "{}: the torchrun job (pid {}, {} ranks) died during {op} ({status}): {} (log: {})",
            self.job.what(),
            self.proc.pid,
            self.ranks,
            log_tail(&self.log, 2),
            self.log.display()
        ))
        .with_help("a rank crashed or was killed; read the log, then restart the run (`tandem run --resume`)")
    }

    fn break_with(&mut self, e: PluginError) -> PluginError {
        self.broken = Some(e.clone());
        e
    }

    /// Asks every rank to leave, then stops the process group.
    pub fn shutdown(&mut self) {
        if self.broken.is_none() && self.proc.exited().is_none() {
            let proc = &self.proc;
            let _ = self
                .chan
                .send(&json!({"op": "shutdown", "args": {}}))
                .and_then(|()| {
                    self.chan
                        .recv(Instant::now() + SHUTDOWN_WAIT, &|| proc.exited())
                });
            let until = Instant::now() + SHUTDOWN_WAIT;
            while self.proc.exited().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.proc.stop();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A Python exception reply → one error line: the operation, the rank, the exception and
/// the traceback's last frames.
fn python_error(what: &str, op: &str, err: Option<&Value>, log: &Path) -> PluginError {
    let s = |k: &str| {
        err.and_then(|e| e.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let kind = s("kind");
    let rank = err
        .and_then(|e| e.get("rank"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let frames: Vec<String> = s("traceback")
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("File "))
        .map(str::to_string)
        .collect();
    let last = frames[frames.len().saturating_sub(2)..].join(" | ");
    let code = match kind.as_str() {
        "ValueError" | "KeyError" | "TypeError" => ErrorCode::InvalidInput,
        "FileNotFoundError" | "OSError" | "PermissionError" => ErrorCode::Io,
        _ if s("message").contains("call init first") || s("message").contains("onload first") => {
            ErrorCode::InvalidState
        }
        _ => ErrorCode::Runtime,
    };
    PluginError::new(
        code,
        format!(
            "{what}: {op} failed on rank {rank}: {kind}: {} [at {last}]",
            s("message")
        ),
    )
    .with_help(format!("the full traceback is in {}", log.display()))
}
