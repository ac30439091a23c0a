//! The torchrun job: writes the embedded Python package, checks the interpreter, launches
//! `python -m torch.distributed.run --standalone --nproc-per-node N -m tandem_fsdp_worker`
//! as a supervised process group with its output in `<run_dir>/logs/fsdp-trainer.log`,
//! accepts rank 0's connection (run token checked), and turns each operation into one
//! request/reply with a deadline. A dead job or a timed-out call marks the worker broken:
//! every later call fails with the same one line instead of hanging.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError};
use tandem_plugin_support::{Python, Supervised, log_tail};

use crate::channel::{Channel, ChannelError};
use crate::options::FsdpOptions;

/// The Python package, embedded so the plugin library is self-contained.
const PACKAGE: [(&str, &str); 5] = [
    (
        "__init__.py",
        include_str!("../python/tandem_fsdp_worker/__init__.py"),
    ),
    (
        "__main__.py",
        include_str!("../python/tandem_fsdp_worker/__main__.py"),
    ),
    (
        "channel.py",
        include_str!("../python/tandem_fsdp_worker/channel.py"),
    ),
    (
        "loss.py",
        include_str!("../python/tandem_fsdp_worker/loss.py"),
    ),
    (
        "trainer.py",
        include_str!("../python/tandem_fsdp_worker/trainer.py"),
    ),
];
/// Grace between SIGTERM and SIGKILL when the job is stopped.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a polite shutdown request may take.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Where and how the job is launched.
pub struct LaunchSpec<'a> {
    /// Hugging Face model directory.
    pub model: &'a Path,
    /// Run directory (exports, logs); empty: a temporary directory.
    pub run_dir: &'a str,
    /// `cpu` or `cuda[:i]`.
    pub device: &'a str,
    /// Parsed options.
    pub opts: &'a FsdpOptions,
}

/// A running torchrun job and its channel to rank 0.
pub struct Worker {
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

fn run_token() -> Result<String> {
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .map_err(|e| PluginError::io(format!("trainer `fsdp`: reading /dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Checks that `python` runs and finds torch, transformers, peft and safetensors (module
/// lookup only: a second, not an import of torch).
fn check_python(python: &Python) -> Result<()> {
    let probe = "import importlib.util as u, sys\n\
                 miss = [m for m in ('torch', 'transformers', 'peft', 'safetensors') if u.find_spec(m) is None]\n\
                 print(' '.join(miss)); sys.exit(3 if miss else 0)";
    let help = "create the venv with `bash scripts/setup.sh` (scripts/setup-python.sh) and point \
                options.python or $TANDEM_PYTHON at its python, or unset them to use the one it \
                records";
    let shown = format!("`{}` (from {})", python.path.display(), python.source);
    match Command::new(&python.path)
        .args(["-c", probe])
        .stdin(Stdio::null())
        .output()
    {
        Err(e) => Err(PluginError::invalid_input(format!(
            "trainer `fsdp`: cannot run Python {shown}: {e}"
        ))
        .with_help(help)),
        Ok(o) if o.status.code() == Some(3) => Err(PluginError::invalid_input(format!(
            "trainer `fsdp`: Python {shown} lacks {}",
            String::from_utf8_lossy(&o.stdout).trim()
        ))
        .with_help(help)),
        Ok(o) if !o.status.success() => Err(PluginError::invalid_input(format!(
            "trainer `fsdp`: Python {shown} failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ))
        .with_help(help)),
        Ok(_) => Ok(()),
    }
}

fn write_package(dir: &Path) -> Result<()> {
    let pkg = dir.join("tandem_fsdp_worker");
    std::fs::create_dir_all(&pkg)
        .map_err(|e| PluginError::io(format!("trainer `fsdp`: creating {}: {e}", pkg.display())))?;
    for (name, text) in PACKAGE {
        let path = pkg.join(name);
        std::fs::write(&path, text).map_err(|e| {
            PluginError::io(format!("trainer `fsdp`: writing {}: {e}", path.display()))
        })?;
    }
    Ok(())
}

impl Worker {
    /// Launches the job and waits for rank 0's hello.
    pub fn launch(spec: &LaunchSpec<'_>) -> Result<Worker> {
        let opts = spec.opts;
        let python = opts.interpreter()?;
        if !spec.model.join("config.json").is_file() {
            return Err(PluginError::invalid_input(format!(
                "trainer `fsdp`: model directory {} has no config.json",
                spec.model.display()
            ))
            .with_help("point [model] path at a Hugging Face model directory"));
        }
        check_python(&python)?;
        let base = if spec.run_dir.is_empty() {
            std::env::temp_dir().join(format!("tandem-fsdp-{}", std::process::id()))
        } else {
            PathBuf::from(spec.run_dir)
        };
        let pkg_dir = base.join("fsdp-worker");
        write_package(&pkg_dir)?;
        let logs = base.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| {
            PluginError::io(format!("trainer `fsdp`: creating {}: {e}", logs.display()))
        })?;
        let log = logs.join("fsdp-trainer.log");
        let out = std::fs::File::create(&log).map_err(|e| {
            PluginError::io(format!("trainer `fsdp`: creating {}: {e}", log.display()))
        })?;
        let err = out
            .try_clone()
            .map_err(|e| PluginError::io(format!("trainer `fsdp`: log file: {e}")))?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| PluginError::io(format!("trainer `fsdp`: listening on loopback: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| PluginError::io(format!("trainer `fsdp`: {e}")))?;
        let token = run_token()?;
        let device = if spec.device.starts_with("cuda") {
            "cuda"
        } else {
            "cpu"
        };
        let cfg = json!({
            "model_path": spec.model.display().to_string(),
            "run_dir": base.display().to_string(),
            "device": device,
            "threads": opts.threads_per_rank(),
            "collective_timeout_s": opts.collective_timeout_s,
            "options": {
                "dtype": opts.dtype,
                "lora": opts.lora,
                "weight_decay": opts.weight_decay,
                "beta1": opts.beta1,
                "beta2": opts.beta2,
                "eps": opts.eps,
            },
        });
        let mut cmd = Command::new(&python.path);
        cmd.args([
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
        ])
        .arg(format!("--nproc-per-node={}", opts.ranks))
        .args(["--max-restarts", "0", "--monitor-interval", "0.5"])
        .args(["-m", "tandem_fsdp_worker"])
        .current_dir(&pkg_dir)
        .env("PYTHONPATH", &pkg_dir)
        .env("PYTHONUNBUFFERED", "1")
        .env("OMP_NUM_THREADS", opts.threads_per_rank().to_string())
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("TANDEM_FSDP_CONFIG", cfg.to_string())
        .env("TANDEM_FSDP_ADDR", addr.to_string())
        .env("TANDEM_FSDP_TOKEN", &token)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
        let proc = Supervised::spawn(cmd, "fsdp-supervisor", STOP_GRACE).map_err(|e| {
            PluginError::invalid_input(format!(
                "trainer `fsdp`: cannot start `{}` (from {}): {e}",
                python.path.display(),
                python.source
            ))
        })?;
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(opts.startup_timeout_s);
        let fail = |proc: &Supervised, what: String| {
            unavailable(format!(
                "trainer `fsdp`: torchrun (pid {}, {} ranks) {what}: {} (log: {})",
                proc.pid,
                opts.ranks,
                log_tail(&log, 2),
                log.display()
            ))
        };
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(PluginError::io(format!("trainer `fsdp`: accept: {e}"))),
            }
            if let Some(status) = proc.exited() {
                return Err(fail(&proc, format!("exited during start-up ({status})")));
            }
            if Instant::now() > deadline {
                return Err(fail(
                    &proc,
                    format!("did not connect within {} s", opts.startup_timeout_s),
                )
                .with_help("raise options.startup_timeout_s or read the log"));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut chan = stream
            .set_nonblocking(false)
            .and_then(|()| Channel::new(stream))
            .map_err(|e| PluginError::io(format!("trainer `fsdp`: channel: {e}")))?;
        let hello = chan
            .recv(deadline, &|| proc.exited())
            .map_err(|e| fail(&proc, format!("sent no hello ({e})")))?;
        if hello.get("token").and_then(Value::as_str) != Some(token.as_str()) {
            return Err(PluginError::runtime(
                "trainer `fsdp`: a process without the run token connected to the control port",
            ));
        }
        let rank0_pid = hello.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
        Ok(Worker {
            proc,
            chan,
            log,
            call_timeout: Duration::from_secs_f64(opts.call_timeout_s),
            broken: None,
            rank0_pid,
            ranks: opts.ranks,
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
                        "trainer `fsdp`: {op} did not finish within {} s; the torchrun job was stopped (log: {})",
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
        Err(python_error(op, reply.get("error"), &self.log))
    }

    fn dead(&self, op: &str, status: &str) -> PluginError {
        unavailable(format!(
            "trainer `fsdp`: the torchrun job (pid {}, {} ranks) died during {op} ({status}): {} (log: {})",
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
fn python_error(op: &str, err: Option<&Value>, log: &Path) -> PluginError {
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
            "trainer `fsdp`: {op} failed on rank {rank}: {kind}: {} [at {last}]",
            s("message")
        ),
    )
    .with_help(format!("the full traceback is in {}", log.display()))
}
