//! One Python worker process of a [`Pool`](super::pool::Pool): the child, its protocol
//! channel (one JSON object a line on stdin/stdout) and its log (stderr, appended to a file
//! per worker slot in the run directory).
//!
//! The child leads its own process group, so a kill reaches anything the user's code started.
//! Its stdout is read by a thread that forwards lines over a channel; waiting for an answer is
//! `recv_timeout` on that channel, so a call that never returns is a [`Fault::Timeout`], and
//! an exit, a signal or a closed pipe is a [`Fault::Died`] with the exit status. The worker
//! script exits by itself when this process is gone (it watches its parent pid).

use serde_json::Value;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a call got no answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fault {
    /// No answer within the timeout; the worker was killed.
    Timeout(Duration),
    /// The worker exited or was killed (its status), or its pipe broke.
    Died(String),
    /// It answered something that is not the protocol.
    Protocol(String),
}

impl Fault {
    /// The failed samples' reason.
    pub(crate) fn reason(&self, log: &Path) -> String {
        match self {
            Fault::Timeout(t) => format!(
                "timed out after {}s (the worker was killed and replaced)",
                t.as_secs_f64()
            ),
            Fault::Died(status) => format!(
                "the Python worker died ({status}) and was replaced; its log: {}",
                log.display()
            ),
            Fault::Protocol(what) => format!("the Python worker broke the protocol: {what}"),
        }
    }
}

/// A running worker.
pub(crate) struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    reader: Option<JoinHandle<()>>,
    /// Its stderr log.
    pub(crate) log: PathBuf,
}

/// How to start a worker.
pub(crate) struct Launch<'a> {
    /// The interpreter.
    pub python: &'a Path,
    /// The worker script.
    pub script: &'a Path,
    /// The log file (appended).
    pub log: PathBuf,
}

impl Worker {
    /// Starts the process (the `init` request is the caller's).
    pub(crate) fn spawn(launch: &Launch<'_>) -> std::io::Result<Worker> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&launch.log)?;
        writeln!(
            log,
            "--- tandem: starting {} {}",
            launch.python.display(),
            launch.script.display()
        )?;
        let mut cmd = Command::new(launch.python);
        cmd.arg(launch.script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .process_group(0);
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("the worker has no stdout pipe"))?;
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::Builder::new()
            .name("tandem-py-reader".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Worker {
            child,
            stdin,
            lines: rx,
            reader: Some(reader),
            log: launch.log.clone(),
        })
    }

    /// Process id (leader of its process group).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one request.
    pub(crate) fn send(&mut self, request: &Value) -> Result<(), Fault> {
        let mut line = request.to_string();
        line.push('\n');
        let written = match self.stdin.as_mut() {
            Some(stdin) => stdin
                .write_all(line.as_bytes())
                .and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("stdin closed")),
        };
        match written {
            Ok(()) => Ok(()),
            Err(_) => Err(Fault::Died(self.exit_status())),
        }
    }

    /// The next answer line, waiting at most `timeout`; on a timeout the worker is killed.
    pub(crate) fn recv(&mut self, timeout: Duration) -> Result<Value, Fault> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => serde_json::from_str(&line).map_err(|e| {
                let shown: String = line.chars().take(120).collect();
                Fault::Protocol(format!("`{shown}` is not JSON ({e})"))
            }),
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                Err(Fault::Timeout(timeout))
            }
            Err(RecvTimeoutError::Disconnected) => Err(Fault::Died(self.exit_status())),
        }
    }

    /// The exit status once stdout closed (waits a little for the exit; kills a process that
    /// closed its output but goes on running).
    fn exit_status(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => {
                    self.kill();
                    return "closed its output; killed".into();
                }
                Err(e) => return format!("status unknown: {e}"),
            }
        }
    }

    /// Closes its input: an idle worker exits (the pool closes every worker's before dropping
    /// them, so they exit together).
    pub(crate) fn close_input(&mut self) {
        self.stdin.take();
    }

    /// Kills the worker's process group and reaps it.
    pub(crate) fn kill(&mut self) {
        tandem_plugin_support::process::signal_group(self.child.id(), libc::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The reader ends at EOF by itself; it is not joined (a stray holder of the pipe must
        // not block the kill).
        self.reader.take();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing stdin ends an idle worker's read loop; one busy in user code is killed.
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_millis(200);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}
