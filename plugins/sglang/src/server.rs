//! One SGLang server per engine rank: either launched and supervised here (pre-flight checks,
//! `python -m sglang.launch_server` in its own process group with the log captured, a
//! supervisor thread recording its exit so every later call fails with one line carrying the
//! log's tail; stop = SIGTERM to the group, SIGKILL after a grace period), or a running one
//! attached by URL. Either way `/health_generate` is polled until it answers 200.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError};
use tandem_plugin_support::Supervised;

use crate::http::{CallError, Client, Trace};
use crate::options::{Launcher, SglangOptions};

/// Grace period between SIGTERM and SIGKILL at shutdown.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// A launched process: its supervisor and its log.
struct Launched {
    proc: Supervised,
    log: PathBuf,
}

/// A running (or dead) server.
pub struct Server {
    /// Client of its HTTP API.
    pub client: Client,
    /// Seconds from launch (or attach) to `/health_generate` = 200.
    pub startup_s: f64,
    launched: Option<Launched>,
}

fn unavailable(msg: String) -> PluginError {
    PluginError::new(ErrorCode::Unavailable, msg)
}

/// The last error lines of `log` on one line.
pub fn log_tail(log: &Path) -> String {
    tandem_plugin_support::log_tail(log, 2)
}

/// Checks that the launcher's Python finds SGLang (module lookup only, no import of torch).
fn check_python(launcher: &Launcher) -> Result<()> {
    let Launcher {
        program,
        args,
        origin,
    } = launcher;
    if args.first().map(String::as_str) != Some("-m") {
        return Ok(());
    }
    let out = Command::new(program)
        .args([
            "-c",
            "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('sglang') else 3)",
        ])
        .stdin(Stdio::null())
        .output();
    match out {
        Err(e) => Err(PluginError::invalid_input(format!(
            "engine `sglang`: cannot run Python `{program}` (from {origin}): {e}"
        ))
        .with_help("point `python` in [engine] options or $TANDEM_PYTHON at a Python with SGLang, or attach with `url`")),
        Ok(o) if o.status.code() == Some(3) => Err(PluginError::invalid_input(format!(
            "engine `sglang`: SGLang is not installed for Python `{program}` (from {origin})"
        ))
        .with_help("install sglang (a CUDA machine: `pip install sglang`) and point `python` at it, or attach to a running server with `url`")),
        Ok(o) if !o.status.success() => Err(PluginError::invalid_input(format!(
            "engine `sglang`: Python `{program}` (from {origin}) failed: {}",
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        ))),
        Ok(_) => Ok(()),
    }
}

fn check_model(model: &Path) -> Result<()> {
    if !model.join("config.json").is_file() {
        return Err(PluginError::invalid_input(format!(
            "engine `sglang`: model directory {} has no config.json",
            model.display()
        ))
        .with_help("point [engine] model at a Hugging Face model directory"));
    }
    Ok(())
}

/// Picks the port: `want` if free, any free one when `want == 0`.
fn pick_port(host: &str, want: u16) -> Result<u16> {
    match TcpListener::bind((host, want)) {
        Ok(l) => Ok(l.local_addr().map(|a| a.port()).unwrap_or(want)),
        Err(e) => Err(PluginError::invalid_input(format!(
            "engine `sglang`: port {host}:{want} is taken ({e})"
        ))
        .with_help("choose another `port` in [engine] options (rank r uses port + r), or 0")),
    }
}

fn trace_of(opts: &SglangOptions) -> Result<Option<Trace>> {
    opts.trace_requests
        .as_deref()
        .map(|p| {
            Trace::open(p).map_err(|e| {
                PluginError::io(format!("engine `sglang`: opening the trace file {p}: {e}"))
                    .with_help("point trace_requests at a writable path")
            })
        })
        .transpose()
}

impl Server {
    /// Attaches to the running server at `url` and waits for `/health_generate`.
    pub fn attach(opts: &SglangOptions, url: &str) -> Result<Server> {
        let started = Instant::now();
        let mut server = Server {
            client: Client::new(url, opts.api_key.clone(), trace_of(opts)?),
            startup_s: 0.0,
            launched: None,
        };
        server.wait_healthy(Duration::from_secs(opts.health_timeout_s), started)?;
        server.startup_s = started.elapsed().as_secs_f64();
        Ok(server)
    }

    /// Launches the server for `rank` on `model` serving `version`, and waits for
    /// `/health_generate`.
    pub fn launch(
        opts: &SglangOptions,
        model: &Path,
        rank: u32,
        version: u64,
        log: &Path,
    ) -> Result<Server> {
        let launcher = opts.launcher()?;
        check_model(model)?;
        check_python(&launcher)?;
        let want = if opts.port == 0 {
            0
        } else {
            opts.port
                .checked_add(u16::try_from(rank).unwrap_or(u16::MAX))
                .ok_or_else(|| {
                    PluginError::invalid_input("engine `sglang`: port + rank exceeds 65535")
                })?
        };
        let port = pick_port(&opts.host, want)?;
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                PluginError::io(format!("engine `sglang`: creating {}: {e}", dir.display()))
            })?;
        }
        let out = File::create(log).map_err(|e| {
            PluginError::io(format!("engine `sglang`: creating {}: {e}", log.display()))
        })?;
        let err = out
            .try_clone()
            .map_err(|e| PluginError::io(format!("engine `sglang`: log file: {e}")))?;
        let mut cmd = Command::new(&launcher.program);
        cmd.args(&launcher.args)
            .args(opts.server_args(model, port, rank, version))
            .envs(opts.server_env())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let started = Instant::now();
        let proc = Supervised::spawn(cmd, &format!("sglang-{rank}-supervisor"), STOP_GRACE)
            .map_err(|e| {
                PluginError::invalid_input(format!(
                    "engine `sglang`: cannot start `{}`: {e}",
                    launcher.program
                ))
                .with_help("set `python` / `command` in [engine] options or $TANDEM_PYTHON")
            })?;
        let host = if opts.host.contains(':') {
            format!("[{}]", opts.host)
        } else {
            opts.host.clone()
        };
        let mut server = Server {
            client: Client::new(
                &format!("http://{host}:{port}"),
                opts.api_key.clone(),
                trace_of(opts)?,
            ),
            startup_s: 0.0,
            launched: Some(Launched {
                proc,
                log: log.to_path_buf(),
            }),
        };
        server.wait_healthy(Duration::from_secs(opts.health_timeout_s), started)?;
        server.startup_s = started.elapsed().as_secs_f64();
        Ok(server)
    }

    fn wait_healthy(&mut self, timeout: Duration, started: Instant) -> Result<()> {
        loop {
            if let Some(l) = &self.launched
                && let Some(status) = l.proc.exited()
            {
                let e = unavailable(format!(
                    "engine `sglang`: server (pid {}) exited during start-up ({status}): {} (log: {})",
                    l.proc.pid,
                    log_tail(&l.log),
                    l.log.display()
                ))
                .with_help("read the log; a CPU-only machine cannot run SGLang (attach to a server with `url`)");
                self.stop();
                return Err(e);
            }
            let last = match self.client.get("/health_generate", Duration::from_secs(20)) {
                Ok(_) => return Ok(()),
                Err(CallError::Status(code, m)) => format!("answered {code} {m}"),
                Err(CallError::Connect(m)) => format!("not reachable ({m})"),
                Err(CallError::Timeout(_)) => "timed out".to_owned(),
            };
            if started.elapsed() > timeout {
                let where_ = match &self.launched {
                    Some(l) => format!(
                        "server (pid {}): {} (log: {})",
                        l.proc.pid,
                        log_tail(&l.log),
                        l.log.display()
                    ),
                    None => format!("server at {}: {last}", self.client.base()),
                };
                let e = PluginError::new(
                    ErrorCode::Timeout,
                    format!(
                        "engine `sglang`: GET /health_generate not 200 after {} s: {where_}",
                        timeout.as_secs()
                    ),
                )
                .with_help("raise health_timeout_s, or check the server (its log)");
                self.stop();
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Process id of a launched server.
    pub fn pid(&self) -> Option<u32> {
        self.launched.as_ref().map(|l| l.proc.pid)
    }

    /// Its log file (launch mode).
    pub fn log(&self) -> Option<&Path> {
        self.launched.as_ref().map(|l| l.log.as_path())
    }

    /// The error for a call that found a launched server dead, or `None` while it runs (and
    /// always for an attached one: its death shows as a refused connection).
    pub fn dead_error(&self) -> Option<PluginError> {
        let l = self.launched.as_ref()?;
        l.proc.exited().map(|status| {
            unavailable(format!(
                "engine `sglang`: server (pid {}) died ({status}): {} (log: {})",
                l.proc.pid,
                log_tail(&l.log),
                l.log.display()
            ))
            .with_help("the engine must be restarted; read the log for the cause")
        })
    }

    /// Stops a launched server (SIGTERM to its group, SIGKILL after a grace period); an
    /// attached one is left running.
    pub fn stop(&mut self) {
        if let Some(l) = self.launched.as_mut() {
            l.proc.stop();
        }
    }
}
