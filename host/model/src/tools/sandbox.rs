//! The `python` tool: the model's code runs in a fresh `python3` process with limits, and what
//! it prints is the tool's answer.
//!
//! - **CPU time, memory, file size**: set with `resource.setrlimit` (hard limits, which the
//!   code cannot raise) by a small bootstrap that then runs the code read from stdin. A run
//!   past its CPU time gets `SIGXCPU`, and `SIGKILL` one second later if it handles that; an
//!   allocation past the address-space cap raises `MemoryError`.
//! - **Wall time**: the process is killed once its wall-clock limit passes (a `sleep`, a
//!   blocked read), whatever the CPU limit says.
//! - **Network**: the process starts in a network namespace of its own (`unshare -n`, or `-rn`
//!   through a user namespace when not root) with no interface but a down loopback, so a
//!   socket reaches nothing. Where neither works (no `unshare`, namespaces forbidden),
//!   [`isolation`] says so, and the bootstrap replaces `socket.socket` with one that raises:
//!   that stops the stdlib's sockets, not code that reaches the OS another way (`ctypes`).
//! - **Files and environment**: it runs in a temporary directory of its own, removed
//!   afterwards, with an empty environment and `python3 -I -S` (no user site, no `site`).
//! - **Processes**: it leads a process group of its own, and the whole group is SIGKILLed
//!   when the run ends or is stopped, so nothing it started outlives it.
//! - **Output**: stdout is the answer, cut to [`SandboxLimits::output_bytes`]; on failure the
//!   last line of stderr (the exception) is the error.
//!
//! Each outcome is an `Ok(answer)` or one [`ToolError::Sandbox`] line: the run goes on and the
//! model reads the line as the tool's answer.

use super::ToolError;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Wall-clock time before the process is killed.
    pub wall: Duration,
    /// CPU seconds (`RLIMIT_CPU`).
    pub cpu_s: u64,
    /// Address space in bytes (`RLIMIT_AS`).
    pub memory_bytes: u64,
    /// Bytes of stdout kept as the answer.
    pub output_bytes: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            wall: Duration::from_secs(10),
            cpu_s: 2,
            memory_bytes: 512 << 20,
            output_bytes: 2048,
        }
    }
}

/// How the sandbox keeps code off the network on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// A network namespace of its own (`unshare -n`).
    NetNamespace,
    /// A network namespace inside a user namespace (`unshare -rn`).
    UserNetNamespace,
    /// No namespace: only the stdlib's sockets are blocked, in-process.
    SocketsBlockedInProcess,
}

impl Isolation {
    /// One line for a plan or a note.
    pub fn describe(self) -> &'static str {
        match self {
            Isolation::NetNamespace => "own network namespace (unshare -n)",
            Isolation::UserNetNamespace => "own user and network namespace (unshare -rn)",
            Isolation::SocketsBlockedInProcess => {
                "no network namespace here (unshare failed): the stdlib's sockets are blocked \
                 in-process only"
            }
        }
    }

    fn prefix(self) -> &'static [&'static str] {
        match self {
            Isolation::NetNamespace => &["unshare", "-n", "--"],
            Isolation::UserNetNamespace => &["unshare", "-rn", "--"],
            Isolation::SocketsBlockedInProcess => &[],
        }
    }
}

/// The isolation this machine allows, probed once (`unshare -n true`, then `-rn`).
pub fn isolation() -> Isolation {
    static FOUND: OnceLock<Isolation> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let works = |args: &[&str]| {
            Command::new("unshare")
                .args(args)
                .arg("true")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if works(&["-n", "--"]) {
            Isolation::NetNamespace
        } else if works(&["-rn", "--"]) {
            Isolation::UserNetNamespace
        } else {
            Isolation::SocketsBlockedInProcess
        }
    })
}

/// The bootstrap: limits, the socket guard when there is no namespace, then the code.
fn bootstrap(l: &SandboxLimits, block_sockets: bool) -> String {
    let guard = if block_sockets {
        "import socket\n\
         class _NoNetwork(socket.socket):\n    \
             def __init__(self, *a, **k):\n        \
                 raise OSError('network access is disabled in the sandbox')\n\
         socket.socket = _NoNetwork\n"
    } else {
        ""
    };
    format!(
        "import resource, sys\n\
         resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu} + 1))\n\
         resource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))\n\
         resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))\n\
         {guard}\
         _code = sys.stdin.read()\n\
         exec(compile(_code, '<tool>', 'exec'), {{'__name__': '__main__'}})\n",
        cpu = l.cpu_s,
        mem = l.memory_bytes,
        fsize = 1u64 << 20,
    )
}

/// Runs `code` under `limits` (see the module doc); the answer is what it printed.
pub fn run_python(code: &str, limits: &SandboxLimits) -> Result<String, ToolError> {
    let fail = |reason: String| ToolError::Sandbox { reason };
    let iso = isolation();
    let dir = tempfile::tempdir().map_err(|e| fail(format!("cannot make its directory: {e}")))?;
    let boot = bootstrap(limits, iso == Isolation::SocketsBlockedInProcess);
    let (program, prefix) = match iso.prefix().split_first() {
        Some((p, rest)) => (*p, rest),
        None => ("python3", &[][..]),
    };
    let mut cmd = Command::new(program);
    cmd.args(prefix);
    if !prefix.is_empty() {
        cmd.arg("python3");
    }
    // A process group of its own: what the code starts dies with it (see `reap`).
    let mut child = cmd
        .process_group(0)
        .args(["-I", "-S", "-c", &boot])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start python3: {e}")))?;
    let keep = limits.output_bytes;
    // stdout: its first `keep` bytes (the answer); stderr: its last 8 KiB (the exception).
    let reader = |pipe: Option<Box<dyn Read + Send>>, head: bool| {
        std::thread::spawn(move || {
            const TAIL: usize = 8 << 10;
            let mut kept = Vec::new();
            let mut total = 0usize;
            if let Some(mut p) = pipe {
                let mut buf = [0u8; 8192];
                while let Ok(n) = p.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    total += n;
                    if head {
                        let room = keep.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    } else {
                        kept.extend_from_slice(&buf[..n]);
                        let over = kept.len().saturating_sub(TAIL);
                        kept.drain(..over);
                    }
                }
            }
            (kept, total)
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        true,
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        false,
    );
    if let Some(mut stdin) = child.stdin.take() {
        // A process that exits before reading all of it closes the pipe: not an error here.
        let _ = stdin.write_all(code.as_bytes());
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= limits.wall => {
                reap(child.id());
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(fail(format!("waiting for python3: {e}"))),
        }
    };
    // Whatever the code started and left running goes with it.
    reap(child.id());
    let (stdout, total) = out.join().unwrap_or_default();
    let (stderr, _) = err.join().unwrap_or_default();
    let Some(status) = status else {
        return Err(fail(format!(
            "stopped after the wall-clock limit of {:.1} s",
            limits.wall.as_secs_f64()
        )));
    };
    if status.success() {
        let mut text = String::from_utf8_lossy(&stdout).trim_end().to_owned();
        if total > keep {
            text.push_str(&format!(" [output cut at {keep} of {total} bytes]"));
        }
        return Ok(text);
    }
    use std::os::unix::process::ExitStatusExt;
    let reason = match status.signal() {
        Some(libc::SIGXCPU) => format!("stopped at the CPU limit of {} s", limits.cpu_s),
        Some(libc::SIGKILL) => format!(
            "killed (past the CPU limit of {} s and its 1 s grace, or out of memory)",
            limits.cpu_s
        ),
        Some(s) => format!("killed by signal {s}"),
        None => {
            let text = String::from_utf8_lossy(&stderr);
            let last = text.lines().rev().find(|l| !l.trim().is_empty());
            last.map_or_else(
                || format!("exited with status {}", status.code().unwrap_or(-1)),
                |l| l.trim().to_owned(),
            )
        }
    };
    Err(fail(reason))
}

/// SIGKILLs the process group `pid` leads (the run and every process it started).
fn reap(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // Already gone is fine: the group may have exited whole.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[cfg(test)]
#[path = "sandbox_tests.rs"]
mod tests;
