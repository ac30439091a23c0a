//! One server per engine rank: either launched and supervised here (pre-flight checks, the
//! launcher in its own process group with the log captured, a supervisor thread recording
//! its exit so every later call fails with one line carrying the log's tail; stop = SIGTERM
//! to the group, SIGKILL after a grace period), or a running one attached by URL. Either way
//! the health route is polled until it answers 200.
//!
//! The process is a [`Supervised`] child started with `PR_SET_PDEATHSIG = SIGTERM`, so if the
//! host process dies the server shuts down too.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError};

use super::Dialect;
use super::http::{CallError, Client, Trace};
use crate::Supervised;
use crate::python::{PYTHON_ENV, resolve_python};

/// Grace period between SIGTERM and SIGKILL at shutdown.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// The origin of a launcher given by the `command` option.
pub const COMMAND_ORIGIN: &str = "the `command` option";

/// The program that starts a server, its leading arguments, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    /// The program (an interpreter, or the first word of `command`).
    pub program: String,
    /// Arguments before the server flags (`-m sglang.launch_server`).
    pub args: Vec<String>,
    /// Where `program` came from (the `python` option, `$TANDEM_PYTHON`, the pointer file of
    /// `scripts/setup-python.sh`, the `command` option), for error messages.
    pub origin: String,
}

impl Launcher {
    /// `command` (its first word is the program), else `python -m MODULE` with the
    /// interpreter from `python`, `$TANDEM_PYTHON` or the venv pointer file; `help_tail` is
    /// added to the help of a missing interpreter (another way to run the engine).
    pub fn resolve(
        component: &str,
        command: Option<&[String]>,
        python: Option<&str>,
        module: &str,
        help_tail: &str,
    ) -> Result<Launcher> {
        if let Some(cmd) = command {
            let mut it = cmd.iter().cloned();
            let program = it.next().unwrap_or_default();
            return Ok(Launcher {
                program,
                args: it.collect(),
                origin: COMMAND_ORIGIN.into(),
            });
        }
        let python = resolve_python(python.map(Path::new)).map_err(|e| {
            PluginError::invalid_input(format!("engine `{component}`: {e}")).with_help(format!(
                "{}; or set ${PYTHON_ENV} or `python = \"...\"` in [engine] options{help_tail}",
                e.help()
            ))
        })?;
        let origin = python.source.to_string();
        let program = python.path.into_os_string().into_string().map_err(|p| {
            PluginError::invalid_input(format!(
                "engine `{component}`: the Python path {} (from {origin}) is not valid UTF-8",
                Path::new(&p).display()
            ))
            .with_help("install the venv under a UTF-8 path")
        })?;
        Ok(Launcher {
            program,
            args: vec!["-m".into(), module.into()],
            origin,
        })
    }
}

/// How to launch one server.
pub struct LaunchSpec<'a> {
    /// The server's names and helps.
    pub dialect: &'static Dialect,
    /// The program and its leading arguments.
    pub launcher: Launcher,
    /// The Python package the interpreter must find (probed only for `python -m …`).
    pub package: &'a str,
    /// Help when the interpreter cannot run.
    pub python_help: &'a str,
    /// Help when it lacks [`LaunchSpec::package`].
    pub install_help: &'a str,
    /// The model directory served (must hold a `config.json`).
    pub model: &'a Path,
    /// Bind address.
    pub host: &'a str,
    /// Port of rank 0 (rank r uses `port + r`); 0: a free one.
    pub port: u16,
    /// The engine rank.
    pub rank: u32,
    /// The log file.
    pub log: &'a Path,
    /// Environment on top of the inherited one.
    pub env: Vec<(String, String)>,
    /// The bearer token (sent on every call).
    pub api_key: Option<String>,
    /// The request trace.
    pub trace: Option<Trace>,
    /// How long start-up may take, and the option that sets it.
    pub health: Health<'a>,
}

/// The health wait: the route polled until 200, each probe's deadline, the whole wait's and
/// the option that sets it (named in the timeout's help).
#[derive(Debug, Clone, Copy)]
pub struct Health<'a> {
    /// `/health`, `/health_generate`.
    pub route: &'a str,
    /// Deadline of one probe.
    pub probe: Duration,
    /// Deadline of the whole wait.
    pub timeout: Duration,
    /// The option of [`Health::timeout`] (`startup_timeout_s`).
    pub option: &'a str,
    /// Help of a server that exited during start-up.
    pub exit_help: &'a str,
}

/// A launched process: its supervisor, its log and its model.
struct Launched {
    proc: Supervised,
    log: PathBuf,
    model: PathBuf,
}

/// A running (or dead) server.
pub struct Server {
    /// Client of its HTTP API.
    pub client: Client,
    /// Seconds from launch (or attach) to the health route's 200.
    pub startup_s: f64,
    launched: Option<Launched>,
}

fn unavailable(msg: String) -> PluginError {
    PluginError::new(ErrorCode::Unavailable, msg)
}

/// `--host HOST --port PORT`: where a launched server listens.
pub fn bind_args(host: &str, port: u16) -> [String; 4] {
    [
        "--host".into(),
        host.into(),
        "--port".into(),
        port.to_string(),
    ]
}

/// The last error lines of `log` on one line (the error line(s) of a crash).
pub fn log_tail(log: &Path) -> String {
    crate::log_tail(log, 2)
}

/// Checks that the launcher's Python finds `spec.package` (module lookup only, no import of
/// torch); a custom `command` is not probed.
fn check_python(spec: &LaunchSpec<'_>) -> Result<()> {
    let Launcher {
        program,
        args,
        origin,
    } = &spec.launcher;
    if args.first().map(String::as_str) != Some("-m") {
        return Ok(());
    }
    let (component, package) = (spec.dialect.component, spec.package);
    let probe = format!(
        "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('{package}') else 3)"
    );
    let out = Command::new(program)
        .args(["-c", &probe])
        .stdin(Stdio::null())
        .output();
    match out {
        Err(e) => Err(PluginError::invalid_input(format!(
            "engine `{component}`: cannot run Python `{program}` (from {origin}): {e}"
        ))
        .with_help(spec.python_help)),
        Ok(o) if o.status.code() == Some(3) => Err(PluginError::invalid_input(format!(
            "engine `{component}`: {} is not installed for Python `{program}` (from {origin})",
            spec.dialect.display
        ))
        .with_help(spec.install_help)),
        Ok(o) if !o.status.success() => Err(PluginError::invalid_input(format!(
            "engine `{component}`: Python `{program}` (from {origin}) failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ))),
        Ok(_) => Ok(()),
    }
}

fn check_model(component: &str, model: &Path) -> Result<()> {
    if !model.join("config.json").is_file() {
        return Err(PluginError::invalid_input(format!(
            "engine `{component}`: model directory {} has no config.json",
            model.display()
        ))
        .with_help(
            "point [engine] model at a Hugging Face model directory (e.g. one written by \
             `tandem model init`)",
        ));
    }
    Ok(())
}

/// The port of `rank`: `port + rank` if free, any free one when `port == 0`.
fn pick_port(component: &str, host: &str, port: u16, rank: u32) -> Result<u16> {
    let want = if port == 0 {
        0
    } else {
        port.checked_add(u16::try_from(rank).unwrap_or(u16::MAX))
            .ok_or_else(|| {
                PluginError::invalid_input(format!(
                    "engine `{component}`: port + rank exceeds 65535"
                ))
            })?
    };
    match TcpListener::bind((host, want)) {
        Ok(l) => Ok(l.local_addr().map(|a| a.port()).unwrap_or(want)),
        Err(e) => Err(PluginError::invalid_input(format!(
            "engine `{component}`: port {host}:{want} is taken ({e})"
        ))
        .with_help(
            "choose another `port` in [engine] options (rank r uses port + r), or 0 for a free one",
        )),
    }
}

/// The log file, created with its directory; stdout and stderr of the server.
fn open_log(component: &str, log: &Path) -> Result<(File, File)> {
    let io = |what: &Path, e: std::io::Error| {
        PluginError::io(format!(
            "engine `{component}`: creating {}: {e}",
            what.display()
        ))
    };
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    let out = File::create(log).map_err(|e| io(log, e))?;
    let err = out.try_clone().map_err(|e| io(log, e))?;
    Ok((out, err))
}

impl Server {
    /// Attaches to the running server at `url` and waits for its health route.
    pub fn attach(
        dialect: &Dialect,
        url: &str,
        api_key: Option<String>,
        trace: Option<Trace>,
        health: Health<'_>,
    ) -> Result<Server> {
        let started = Instant::now();
        let mut server = Server {
            client: Client::new(url, api_key, trace),
            startup_s: 0.0,
            launched: None,
        };
        server.wait_healthy(dialect, health, started)?;
        server.startup_s = started.elapsed().as_secs_f64();
        Ok(server)
    }

    /// Launches the server of `spec` (pre-flight first: model dir, interpreter, port) and
    /// waits for its health route; `args` gets the chosen port.
    pub fn launch(spec: LaunchSpec<'_>, args: impl FnOnce(u16) -> Vec<String>) -> Result<Server> {
        let component = spec.dialect.component;
        check_model(component, spec.model)?;
        check_python(&spec)?;
        let port = pick_port(component, spec.host, spec.port, spec.rank)?;
        let (out, err) = open_log(component, spec.log)?;
        let program = &spec.launcher.program;
        let mut cmd = Command::new(program);
        cmd.args(&spec.launcher.args)
            .args(args(port))
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let started = Instant::now();
        let thread = format!("{component}-{}-supervisor", spec.rank);
        let proc = Supervised::spawn(cmd, &thread, STOP_GRACE).map_err(|e| {
            PluginError::invalid_input(format!(
                "engine `{component}`: cannot start `{program}`: {e}"
            ))
            .with_help("set `python` / `command` in [engine] options or $TANDEM_PYTHON")
        })?;
        let mut server = Server {
            client: Client::new(&Client::base_of(spec.host, port), spec.api_key, spec.trace),
            startup_s: 0.0,
            launched: Some(Launched {
                proc,
                log: spec.log.to_path_buf(),
                model: spec.model.to_path_buf(),
            }),
        };
        server.wait_healthy(spec.dialect, spec.health, started)?;
        server.startup_s = started.elapsed().as_secs_f64();
        Ok(server)
    }

    fn wait_healthy(&mut self, dialect: &Dialect, h: Health<'_>, started: Instant) -> Result<()> {
        let component = dialect.component;
        loop {
            if let Some(l) = &self.launched
                && let Some(status) = l.proc.exited()
            {
                let e = unavailable(format!(
                    "engine `{component}`: server (pid {}) on {} exited during start-up \
                     ({status}): {} (log: {})",
                    l.proc.pid,
                    l.model.display(),
                    log_tail(&l.log),
                    l.log.display()
                ))
                .with_help(h.exit_help);
                self.stop();
                return Err(e);
            }
            let last = match self.client.get(h.route, h.probe) {
                Ok(_) => return Ok(()),
                Err(CallError::Status(code, m)) => format!("answered {code} {m}"),
                Err(CallError::Connect(m)) => format!("not reachable ({m})"),
                Err(CallError::Timeout(_)) => "timed out".to_owned(),
            };
            if started.elapsed() > h.timeout {
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
                        "engine `{component}`: GET {} not 200 after {} s: {where_}",
                        h.route,
                        h.timeout.as_secs()
                    ),
                )
                .with_help(format!("raise {}, or check the server (its log)", h.option));
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

    /// The error for a call that found a launched server dead, or `None` while it runs (and
    /// always for an attached one: its death shows as a refused connection).
    pub fn dead_error(&self, dialect: &Dialect) -> Option<PluginError> {
        let l = self.launched.as_ref()?;
        l.proc.exited().map(|status| {
            unavailable(format!(
                "engine `{}`: server (pid {}) died ({status}): {} (log: {})",
                dialect.component,
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
