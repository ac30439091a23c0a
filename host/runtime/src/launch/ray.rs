//! Workers placed by Ray: the controller (on a Ray node) runs Tandem's Ray driver
//! (`ray_driver.py`, written into the run directory). One `hold` driver creates the run's
//! placement group — a bundle per rank, the job's strategy and resources — and keeps it while
//! the launcher lives; one `run` driver per worker starts an actor in the rank's bundle that
//! starts `tandem worker` on that node, copies its output into the worker's log and exits the
//! way the worker did. That driver is the child this controller watches, as `srun` is for
//! Slurm; killing it takes the actor and the worker with it. The run token travels in the
//! driver's environment and then as an actor method argument, never on a command line.
//! Ray has no maintained Rust client; its Python API is the supported one.

use crate::error::RuntimeError;
use crate::worker::WorkerSpec;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;
use tandem_control::Role;

/// The driver, shipped inside the binary so a run needs no Tandem checkout on the head node.
const DRIVER: &str = include_str!("ray_driver.py");

/// How long the placement group may take to be placed (the driver gives up after 120 s).
const PLACE_TIMEOUT: Duration = Duration::from_secs(150);

/// Where and how Ray places the workers.
#[derive(Debug, Clone, PartialEq)]
pub struct RayOptions {
    /// A python with `ray` (the driver's interpreter).
    pub python: PathBuf,
    /// The cluster's address (`auto`, or the head's `host:port`).
    pub address: String,
    /// Placement strategy: `PACK`, `SPREAD`, `STRICT_PACK` or `STRICT_SPREAD`.
    pub strategy: String,
    /// One bundle per engine rank, in rank order.
    pub engine_bundles: Vec<BTreeMap<String, f64>>,
    /// One bundle per trainer rank, in rank order.
    pub trainer_bundles: Vec<BTreeMap<String, f64>>,
}

impl RayOptions {
    /// The bundle `role` rank `rank` runs in. A rank past its role's list (the drafter trainer
    /// after the policy's ranks) shares the last bundle of its role.
    pub fn bundle(&self, role: Role, rank: u32) -> usize {
        let (offset, n) = match role {
            Role::Engine => (0, self.engine_bundles.len()),
            Role::Trainer => (self.engine_bundles.len(), self.trainer_bundles.len()),
        };
        offset + (rank as usize).min(n.saturating_sub(1))
    }

    /// `python ray_driver.py run ADDRESS GROUP BUNDLE -- <exe>`; the caller adds the worker's
    /// arguments.
    pub(crate) fn command(&self, group: &RayGroup, spec: &WorkerSpec, exe: &Path) -> Command {
        let mut cmd = Command::new(&self.python);
        cmd.arg(&group.driver)
            .args(["run", &self.address, &group.name])
            .arg(self.bundle(spec.role, spec.rank).to_string())
            .arg("--")
            .arg(exe)
            // The driver's own Python output must not sit in a buffer when it dies.
            .env("PYTHONUNBUFFERED", "1");
        cmd
    }
}

/// The run's placement group, held by a `hold` driver until this value drops.
pub(crate) struct RayGroup {
    /// The group's name in namespace `tandem`.
    pub name: String,
    /// The driver script in the run directory.
    pub driver: PathBuf,
    /// The node address of every bundle, as Ray placed them.
    pub nodes: Vec<String>,
    holder: Child,
    /// Closing it tells the holder to release the group.
    stdin: Option<ChildStdin>,
}

impl RayGroup {
    /// Writes the driver into `run_dir`, starts the holder and waits until the run's group
    /// (named after this process and the time) is placed.
    pub(crate) fn place(opts: &RayOptions, run_dir: &Path) -> Result<RayGroup, RuntimeError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("tandem-{}-{nanos:x}", std::process::id());
        let io = |context: String| move |source| RuntimeError::Io { context, source };
        let driver = run_dir.join("ray_driver.py");
        std::fs::write(&driver, DRIVER).map_err(io(format!("writing {}", driver.display())))?;
        let bundles: Vec<&BTreeMap<String, f64>> = opts
            .engine_bundles
            .iter()
            .chain(&opts.trainer_bundles)
            .collect();
        let bundles_json = serde_json::to_string(&bundles)
            .map_err(|e| RuntimeError::usage(format!("the Ray bundles do not serialize: {e}")))?;
        let log_path = run_dir.join("logs").join("ray-placement.log");
        let log = std::fs::File::create(&log_path)
            .map_err(io(format!("creating {}", log_path.display())))?;
        let mut holder = Command::new(&opts.python)
            .arg(&driver)
            .args(["hold", &opts.address, &name, &opts.strategy, &bundles_json])
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                RuntimeError::runtime(format!(
                    "cannot start the Ray driver with {}: {e}",
                    opts.python.display()
                ))
                .with_help(
                    "set launcher.python (or TANDEM_RAY_PYTHON) to a python with `ray` \
                     (bash scripts/setup-ray.sh makes one)",
                )
            })?;
        let stdin = holder.stdin.take();
        let Some(stdout) = holder.stdout.take() else {
            return Err(RuntimeError::runtime("the Ray driver has no stdout pipe"));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let fail = |holder: &mut Child, why: String| {
            let _ = holder.kill();
            let _ = holder.wait();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            RuntimeError::runtime(format!(
                "Ray placement group {name} at {}: {why}{}{}",
                opts.address,
                if tail.is_empty() { "" } else { ": " },
                tail.join(" | ")
            ))
            .with_help(if log.contains("No module named 'ray'") {
                format!(
                    "{} has no `ray`: set launcher.python or TANDEM_RAY_PYTHON to one that has \
                     (bash scripts/setup-ray.sh makes one)",
                    opts.python.display()
                )
            } else {
                format!(
                    "run the controller on a Ray node of that cluster, with the resources the \
                     bundles ask for (`ray status`; log {})",
                    log_path.display()
                )
            })
        };
        let line = match rx.recv_timeout(PLACE_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let secs = PLACE_TIMEOUT.as_secs();
                return Err(fail(&mut holder, format!("not placed within {secs} s")));
            }
        };
        let Some(json) = line.trim().strip_prefix("ready ") else {
            return Err(fail(&mut holder, "the driver failed".into()));
        };
        let nodes: Vec<String> = serde_json::from_str(json).map_err(|e| {
            RuntimeError::runtime(format!("the Ray driver's `ready` line is not JSON: {e}"))
        })?;
        tracing::info!(
            "Ray placement group {name} ({}): bundles on {}",
            opts.strategy,
            nodes.join(", ")
        );
        Ok(RayGroup {
            name,
            driver,
            nodes,
            holder,
            stdin,
        })
    }
}

impl Drop for RayGroup {
    fn drop(&mut self) {
        // Closing stdin lets the holder release the group itself; a kill does the same (the
        // group belongs to its Ray job) when it does not end within a few seconds.
        if let Some(mut s) = self.stdin.take() {
            let _ = s.flush();
        }
        for _ in 0..50 {
            if matches!(self.holder.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_are_engines_then_trainers_and_extra_ranks_share_the_last() {
        let b = |cpu: f64| BTreeMap::from([("CPU".to_string(), cpu)]);
        let o = RayOptions {
            python: "python3".into(),
            address: "auto".into(),
            strategy: "PACK".into(),
            engine_bundles: vec![b(1.0), b(1.0)],
            trainer_bundles: vec![b(2.0)],
        };
        assert_eq!(o.bundle(Role::Engine, 0), 0);
        assert_eq!(o.bundle(Role::Engine, 1), 1);
        assert_eq!(o.bundle(Role::Trainer, 0), 2);
        // The drafter trainer (rank past the policy's) shares the trainers' last bundle.
        assert_eq!(o.bundle(Role::Trainer, 1), 2);
    }
}
