//! One supervised vLLM server process: pre-flight checks (interpreter, vLLM importable, model
//! dir, port free), launch in its own process group with the log captured to a file, wait for
//! `/health`, and a supervisor thread that records the exit of a dead server so every later
//! call fails with one line carrying the log's tail.
//!
//! The process is a `tandem_plugin_support::Supervised` child: its own process group, started
//! with `PR_SET_PDEATHSIG = SIGTERM`, so if the host process dies the server shuts down too
//! (vLLM's API server stops its engine-core and worker children on SIGTERM).

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError};
use tandem_plugin_support::Supervised;

use crate::http::{CallError, Client};
use crate::options::{EXTENSION_CLASS, EXTENSION_MODULE, Launcher, VllmOptions};

/// Grace period between SIGTERM and SIGKILL at shutdown.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// A running (or dead) server.
pub struct Server {
    /// Process id of the API server (leader of its process group).
    pub pid: u32,
    /// Client of its HTTP API.
    pub client: Client,
    /// Its log file.
    pub log: PathBuf,
    /// Model directory it was started on.
    pub model: PathBuf,
    /// Seconds from launch to `/health` = 200.
    pub startup_s: f64,
    proc: Supervised,
}

/// The last error lines of `log` on one line (the error line(s) of a crash).
pub fn log_tail(log: &Path) -> String {
    tandem_plugin_support::log_tail(log, 2)
}

fn unavailable(msg: String) -> PluginError {
    PluginError::new(ErrorCode::Unavailable, msg)
}

/// Checks that the launcher's Python can import vLLM (fast: module lookup only, no import of
/// torch).
fn check_python(launcher: &Launcher) -> Result<()> {
    let Launcher {
        program,
        args,
        origin,
    } = launcher;
    if args.first().map(String::as_str) != Some("-m") {
        return Ok(()); // a custom `command`: nothing to probe
    }
    let out = Command::new(program)
        .args([
            "-c",
            "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)",
        ])
        .stdin(Stdio::null())
        .output();
    match out {
        Err(e) => Err(PluginError::invalid_input(format!(
            "engine `vllm`: cannot run Python `{program}` (from {origin}): {e}"
        ))
        .with_help("run `bash scripts/setup.sh` (scripts/setup-python.sh creates the venv), or point `python` in [engine] options or $TANDEM_PYTHON at the venv's python")),
        Ok(o) if o.status.code() == Some(3) => Err(PluginError::invalid_input(format!(
            "engine `vllm`: vLLM is not installed for Python `{program}` (from {origin})"
        ))
        .with_help("create the venv with `bash scripts/setup.sh` (scripts/setup-python.sh) and point `python` / $TANDEM_PYTHON at its python, or unset them to use the one it records")),
        Ok(o) if !o.status.success() => Err(PluginError::invalid_input(format!(
            "engine `vllm`: Python `{program}` (from {origin}) failed: {}",
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        ))),
        Ok(_) => Ok(()),
    }
}

/// Writes the worker extension module next to the logs (`<run_dir>/vllm-ext/`) and returns
/// its directory (put on the server's `PYTHONPATH`).
fn write_extension(log: &Path) -> Result<PathBuf> {
    let base = log
        .parent()
        .and_then(Path::parent)
        .map_or_else(std::env::temp_dir, Path::to_path_buf);
    let dir = base.join("vllm-ext");
    let (name, text) = EXTENSION_MODULE;
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(name), text))
        .map_err(|e| {
            PluginError::io(format!(
                "engine `vllm`: writing the worker extension into {}: {e}",
                dir.display()
            ))
        })?;
    Ok(dir)
}

fn check_model(model: &Path) -> Result<()> {
    if !model.join("config.json").is_file() {
        return Err(PluginError::invalid_input(format!(
            "engine `vllm`: model directory {} has no config.json",
            model.display()
        ))
        .with_help("point [engine] model at a Hugging Face model directory (e.g. one written by `tandem model init`)"));
    }
    Ok(())
}

/// Picks the port: `want` if free, any free one when `want == 0`.
fn pick_port(host: &str, want: u16) -> Result<u16> {
    match TcpListener::bind((host, want)) {
        Ok(l) => Ok(l.local_addr().map(|a| a.port()).unwrap_or(want)),
        Err(e) => Err(PluginError::invalid_input(format!(
            "engine `vllm`: port {host}:{want} is taken ({e})"
        ))
        .with_help(
            "choose another `port` in [engine] options (rank r uses port + r), or 0 for a free one",
        )),
    }
}

impl Server {
    /// Launches the server for `rank` on `model` (tokenizer files from `tokenizer`) and waits
    /// for `/health`.
    pub fn launch(
        opts: &VllmOptions,
        model: &Path,
        tokenizer: &Path,
        rank: u32,
        log: &Path,
    ) -> Result<Server> {
        let launcher = opts.launcher()?;
        check_model(model)?;
        check_python(&launcher)?;
        let Launcher {
            program,
            args: lead,
            ..
        } = launcher;
        let want = if opts.port == 0 {
            0
        } else {
            opts.port
                .checked_add(u16::try_from(rank).unwrap_or(u16::MAX))
                .ok_or_else(|| {
                    PluginError::invalid_input("engine `vllm`: port + rank exceeds 65535")
                })?
        };
        let port = pick_port(&opts.host, want)?;
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                PluginError::io(format!("engine `vllm`: creating {}: {e}", dir.display()))
            })?;
        }
        let out = File::create(log).map_err(|e| {
            PluginError::io(format!("engine `vllm`: creating {}: {e}", log.display()))
        })?;
        let err = out
            .try_clone()
            .map_err(|e| PluginError::io(format!("engine `vllm`: log file: {e}")))?;
        let ext_dir = write_extension(log)?;
        let python_path = match std::env::var_os("PYTHONPATH") {
            Some(p) if !p.is_empty() => {
                let mut v = ext_dir.clone().into_os_string();
                v.push(":");
                v.push(p);
                v
            }
            _ => ext_dir.clone().into_os_string(),
        };
        let mut cmd = Command::new(&program);
        cmd.args(&lead)
            .args(opts.server_args(model, tokenizer, port, rank))
            .args(["--worker-extension-cls", EXTENSION_CLASS])
            .env("PYTHONPATH", python_path)
            .envs(opts.server_env())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let started = Instant::now();
        let proc = Supervised::spawn(cmd, &format!("vllm-{rank}-supervisor"), STOP_GRACE).map_err(
            |e| {
                PluginError::invalid_input(format!("engine `vllm`: cannot start `{program}`: {e}"))
                    .with_help("set `python` / `command` in [engine] options or $TANDEM_PYTHON")
            },
        )?;
        let mut server = Server {
            pid: proc.pid,
            client: Client::new(&opts.host, port),
            log: log.to_path_buf(),
            model: model.to_path_buf(),
            startup_s: 0.0,
            proc,
        };
        server.wait_healthy(Duration::from_secs(opts.startup_timeout_s), started)?;
        server.startup_s = started.elapsed().as_secs_f64();
        Ok(server)
    }

    fn wait_healthy(&mut self, timeout: Duration, started: Instant) -> Result<()> {
        loop {
            if let Some(status) = self.exited() {
                let e = unavailable(format!(
                    "engine `vllm`: server (pid {}) on {} exited during start-up ({status}): {} (log: {})",
                    self.pid,
                    self.model.display(),
                    log_tail(&self.log),
                    self.log.display()
                ));
                self.stop();
                return Err(e);
            }
            match self.client.get("/health", Duration::from_secs(5)) {
                Ok(_) => return Ok(()),
                Err(CallError::Status(..) | CallError::Connect(_) | CallError::Timeout(_)) => {}
                Err(CallError::Body(_)) => {}
            }
            if started.elapsed() > timeout {
                let e = PluginError::new(
                    ErrorCode::Timeout,
                    format!(
                        "engine `vllm`: server (pid {}) not healthy after {} s: {} (log: {})",
                        self.pid,
                        timeout.as_secs(),
                        log_tail(&self.log),
                        self.log.display()
                    ),
                )
                .with_help("raise startup_timeout_s or read the log");
                self.stop();
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `Some(status)` once the server process has exited.
    pub fn exited(&self) -> Option<String> {
        self.proc.exited()
    }

    /// The error for a call that found the server dead, or `None` while it runs.
    pub fn dead_error(&self) -> Option<PluginError> {
        self.exited().map(|status| {
            unavailable(format!(
                "engine `vllm`: server (pid {}) died ({status}): {} (log: {})",
                self.pid,
                log_tail(&self.log),
                self.log.display()
            ))
            .with_help("the engine must be restarted; read the log for the cause")
        })
    }

    /// Stops the server (SIGTERM to its group, SIGKILL after a grace period) and waits.
    pub fn stop(&mut self) {
        self.proc.stop();
    }
}
