//! A supervised child process.
//!
//! The child leads its own process group (so a stop reaches its children too: vLLM's engine
//! core, torchrun's ranks) and is started with `PR_SET_PDEATHSIG = SIGTERM`. That signal
//! fires when the *thread* that forked the child exits, so the child is forked by a
//! supervisor thread that lives exactly as long as the child is wanted: it polls the child,
//! records its exit status, and on [`Supervised::stop`] sends SIGTERM to the group, then
//! SIGKILL after a grace period. If the host process dies, the child gets SIGTERM.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the supervisor looks at the child.
const POLL: Duration = Duration::from_millis(100);

/// A running (or exited) child process owned by a supervisor thread.
pub struct Supervised {
    /// Process id of the child (leader of its process group).
    pub pid: u32,
    exit: Arc<Mutex<Option<String>>>,
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Supervised {
    /// Spawns `cmd` in its own process group from a new supervisor thread named `name`.
    /// `grace` is how long a stop waits after SIGTERM before SIGKILL.
    pub fn spawn(mut cmd: Command, name: &str, grace: Duration) -> std::io::Result<Supervised> {
        cmd.process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe prctl(2); it touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let exit = Arc::new(Mutex::new(None));
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (pid_tx, pid_rx) = mpsc::channel::<std::io::Result<u32>>();
        let exit2 = Arc::clone(&exit);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || supervise(cmd, pid_tx, stop_rx, exit2, grace))?;
        let pid = match pid_rx.recv() {
            Ok(Ok(pid)) => pid,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(std::io::Error::other(
                    "the supervisor thread ended before the child started",
                ));
            }
        };
        Ok(Supervised {
            pid,
            exit,
            stop: stop_tx,
            thread: Some(thread),
        })
    }

    /// `Some(status)` once the child has exited (or was stopped).
    pub fn exited(&self) -> Option<String> {
        self.exit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the child's process group (SIGTERM, SIGKILL after the grace period) and waits.
    pub fn stop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends `sig` to the process group led by `pid`.
pub fn signal_group(pid: u32, sig: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals the process group the child leads (it
        // was started with process_group(0)); no memory is shared with the callee.
        unsafe {
            libc::kill(-pid, sig);
        }
    }
}

fn stop_child(child: &mut Child, grace: Duration) {
    signal_group(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            signal_group(child.id(), libc::SIGKILL);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal_group(child.id(), libc::SIGKILL);
    let _ = child.wait();
}

fn supervise(
    mut cmd: Command,
    pid_tx: mpsc::Sender<std::io::Result<u32>>,
    stop_rx: mpsc::Receiver<()>,
    exit: Arc<Mutex<Option<String>>>,
    grace: Duration,
) {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = pid_tx.send(Err(e));
            return;
        }
    };
    let _ = pid_tx.send(Ok(child.id()));
    loop {
        match stop_rx.recv_timeout(POLL) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                let was = child.try_wait().ok().flatten();
                stop_child(&mut child, grace);
                let mut slot = exit.lock().unwrap_or_else(PoisonError::into_inner);
                if slot.is_none() {
                    *slot = Some(match was {
                        Some(status) => status.to_string(),
                        None => "stopped by the plugin".into(),
                    });
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            // The leader is gone; make sure nothing it started lingers.
            signal_group(child.id(), libc::SIGKILL);
            *exit.lock().unwrap_or_else(PoisonError::into_inner) = Some(status.to_string());
            // Keep the thread (and so PDEATHSIG semantics) until the owner stops us.
            let _ = stop_rx.recv();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn records_the_exit_and_stops_a_running_group() {
        let mut c = Command::new("sh");
        c.args(["-c", "exit 3"]);
        let s = Supervised::spawn(c, "t-exit", Duration::from_secs(1)).unwrap();
        let t = Instant::now();
        while s.exited().is_none() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(s.exited().unwrap().contains('3'), "{:?}", s.exited());

        let mut c = Command::new("sh");
        c.args(["-c", "sleep 30 & sleep 30"]);
        let mut s = Supervised::spawn(c, "t-stop", Duration::from_secs(1)).unwrap();
        assert!(s.exited().is_none());
        let pid = s.pid;
        s.stop();
        assert!(s.exited().is_some());
        // stop() reaps the leader; the SIGKILL it sent the group reaches the other members
        // asynchronously, and the background `sleep` (now init's child) stays a zombie until
        // init reaps it. So wait, bounded, until no member of the group is alive.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut live = live_members(pid);
        while !live.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            live = live_members(pid);
        }
        assert!(
            live.is_empty(),
            "process group {pid} survived stop(): {live:?} still alive after 30 s"
        );
    }

    /// Processes of group `pgid` that are alive (not zombies), from `/proc/<pid>/stat`.
    fn live_members(pgid: u32) -> Vec<u32> {
        // SAFETY: kill(2) with signal 0 only probes whether the group still exists.
        if unsafe { libc::kill(-(pgid as i32), 0) } != 0 {
            return Vec::new();
        }
        let in_group = |pid: u32| {
            // A process that exited since the listing has no stat: not alive.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // After `pid (comm)`: state, ppid, pgrp.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.len() > 2 && f[2] == pgid.to_string() && !matches!(f[0], "Z" | "X")
        };
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| in_group(pid))
            .collect()
    }

    #[test]
    fn a_missing_program_is_an_error() {
        let c = Command::new("/nonexistent/tandem-no-such-program");
        assert!(Supervised::spawn(c, "t-missing", Duration::from_secs(1)).is_err());
    }
}
