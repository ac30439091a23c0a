//! Weights & Biases through the `wandb` Python package: a sidecar process the run owns
//! (`python/tandem_wandb_sidecar.py`, passed with `-c`), fed JSON lines from this process.
//! Each call waits for its answer line with a limit; a sidecar that does not answer is killed
//! and the tracker is down until the next try starts a new one. The W&B run id is chosen
//! here and kept in the tracking state, so a resumed run (or `tandem log push`) continues the
//! same W&B run (`resume = "allow"`).

use crate::error::TrackError;
use crate::flatten::Line;
use crate::section::WandbPlan;
use crate::sinks::{RunInfo, Sink};
use crate::state::SinkState;
use serde_json::{Map, Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

const SIDECAR: &str = include_str!("../python/tandem_wandb_sidecar.py");
const NAME: &str = "wandb";
/// How to get a Python with `wandb`.
pub(crate) const INSTALL_HELP: &str = "run `bash scripts/setup-track.sh` (it records its Python \
     for Tandem), or set [logging] python / $TANDEM_TRACK_PYTHON to a Python with `wandb`";
/// `wandb.init` (online: a server round trip and the wandb-core service's start).
const INIT_TIMEOUT: Duration = Duration::from_secs(120);
/// Any other call.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `python` runs and imports `wandb`: `Err(one line)` when not.
pub(crate) fn check_python(python: &Path) -> Result<(), String> {
    let out = Command::new(python)
        .args(["-c", "import wandb"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "cannot run the W&B sidecar's Python {}: {e}",
                python.display()
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or("no output");
    Err(format!("{} cannot import wandb ({last})", python.display()))
}

struct Sidecar {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<String>,
}

impl Sidecar {
    fn start(python: &Path) -> Result<Sidecar, TrackError> {
        let mut child = Command::new(python)
            .args(["-u", "-c", SIDECAR])
            .env("WANDB_SILENT", "true")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                TrackError::tracker(
                    NAME,
                    format!("starting the sidecar ({}): {e}", python.display()),
                )
            })?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => return Err(TrackError::tracker(NAME, "the sidecar has no pipes")),
        };
        let (tx, answers) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Sidecar {
            child,
            stdin,
            answers,
        })
    }

    /// One request and its answer (`Err` for `ok: false`, a dead or silent sidecar).
    fn call(&mut self, req: &Value, limit: Duration) -> Result<Value, TrackError> {
        let op = req["op"].as_str().unwrap_or("?").to_string();
        writeln!(self.stdin, "{req}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| TrackError::tracker(NAME, format!("{op}: the sidecar is gone ({e})")))?;
        let line = match self.answers.recv_timeout(limit) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                return Err(TrackError::tracker(
                    NAME,
                    format!("{op}: no answer in {} s (sidecar stopped)", limit.as_secs()),
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                return Err(TrackError::tracker(
                    NAME,
                    format!("{op}: the sidecar exited ({status})"),
                ));
            }
        };
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| TrackError::tracker(NAME, format!("{op}: bad answer ({e}): {line}")))?;
        if v["ok"].as_bool() == Some(true) {
            Ok(v)
        } else {
            let err = v["error"].as_str().unwrap_or("failed");
            Err(TrackError::tracker(NAME, format!("{op}: {err}")))
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The W&B tracker of a run.
pub(crate) struct WandbSink {
    plan: WandbPlan,
    sidecar: Option<Sidecar>,
}

impl WandbSink {
    pub(crate) fn new(plan: WandbPlan) -> WandbSink {
        WandbSink {
            plan,
            sidecar: None,
        }
    }

    fn sidecar(&mut self) -> Result<&mut Sidecar, TrackError> {
        self.sidecar
            .as_mut()
            .ok_or_else(|| TrackError::tracker(NAME, "no sidecar running"))
    }
}

impl Sink for WandbSink {
    fn name(&self) -> &'static str {
        NAME
    }

    fn key(&self) -> String {
        let s = &self.plan.section;
        format!("wandb {}/{}", s.entity.as_deref().unwrap_or("-"), s.project)
    }

    fn open(&mut self, state: &mut SinkState, run: &RunInfo) -> Result<(), TrackError> {
        self.sidecar = None;
        let id = state.run_id.clone().unwrap_or_else(new_run_id);
        let s = &self.plan.section;
        let req = json!({
            "op": "init",
            "project": s.project,
            "entity": s.entity,
            "group": s.group,
            "name": s.name.clone().unwrap_or_else(|| run.name.clone()),
            "mode": s.mode.as_str(),
            "dir": run.run_dir,
            "id": id,
            "config": run.config,
        });
        let mut car = Sidecar::start(&self.plan.python)?;
        car.call(&req, INIT_TIMEOUT)?;
        state.run_id = Some(id);
        self.sidecar = Some(car);
        Ok(())
    }

    fn send(&mut self, lines: &[&Line]) -> Result<(), TrackError> {
        let rows: Vec<Value> = lines
            .iter()
            .map(|l| {
                let mut row = Map::new();
                row.insert("step".into(), json!(l.step));
                for (k, v) in l.scalars.iter().filter(|(_, v)| v.is_finite()) {
                    row.insert(k.clone(), json!(v));
                }
                Value::Object(row)
            })
            .collect();
        self.sidecar()?
            .call(&json!({"op": "log", "rows": rows}), CALL_TIMEOUT)
            .map(|_| ())
    }

    fn finish(&mut self, checkpoint: Option<&Path>, failed: bool) -> Result<(), TrackError> {
        let Some(car) = self.sidecar.as_mut() else {
            return Ok(());
        };
        let summary = match checkpoint {
            Some(c) => json!({"tandem.checkpoint": c.display().to_string()}),
            None => json!({}),
        };
        let req = json!({"op": "finish", "summary": summary, "exit_code": i32::from(failed)});
        let r = car.call(&req, INIT_TIMEOUT);
        self.sidecar = None;
        r.map(|_| ())
    }
}

/// A new W&B run id: 8 characters of `[a-z0-9]` from the clock and the process id (W&B's
/// own ids have this shape).
fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut x = nanos ^ (u128::from(std::process::id()) << 64);
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..8)
        .map(|_| {
            let c = alphabet[(x % 36) as usize] as char;
            x /= 36;
            c
        })
        .collect()
}
