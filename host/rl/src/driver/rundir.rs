//! The run directory: its files, the checks before a run writes into it (a new run needs a
//! directory without a run, `--resume` one with it), and the job a run was started from.

use super::RunOptions;
use crate::config::RunPlan;
use crate::error::RlError;
use std::path::{Path, PathBuf};

/// Files of a run directory.
pub struct RunFiles {
    /// `metrics.jsonl`.
    pub metrics: PathBuf,
    /// `events.jsonl`.
    pub events: PathBuf,
    /// `plot.png`.
    pub plot: PathBuf,
    /// `run.json` (job path, for `--resume`).
    pub run_json: PathBuf,
    /// `rollouts.jsonl` (`[run] dump_rollouts`).
    pub rollouts: PathBuf,
    /// `eval.jsonl` (`[eval]`: each evaluation's answers).
    pub eval: PathBuf,
}

impl RunFiles {
    /// The files of `run_dir`.
    pub fn of(run_dir: &Path) -> RunFiles {
        RunFiles {
            metrics: run_dir.join("metrics.jsonl"),
            events: run_dir.join("events.jsonl"),
            plot: run_dir.join("plot.png"),
            run_json: run_dir.join("run.json"),
            rollouts: run_dir.join("rollouts.jsonl"),
            eval: run_dir.join("eval.jsonl"),
        }
    }
}

/// `p` made absolute (as it is when relative paths fail to resolve).
pub(crate) fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Checks the run directory: a new run needs one without metrics, a resume one with them.
/// A new run's directory gets `run.json` and a copy of the job file.
pub(super) fn prepare(plan: &RunPlan, opts: &RunOptions) -> Result<(), RlError> {
    let files = RunFiles::of(&opts.run_dir);
    let dir = opts.run_dir.display();
    if opts.resume {
        if !files.metrics.is_file() {
            return Err(RlError::usage(format!(
                "--resume {dir}: not a run directory (no metrics.jsonl)"
            )));
        }
        return Ok(());
    }
    if files.metrics.exists() {
        return Err(
            RlError::usage(format!("run directory {dir} already holds a run")).with_help(format!(
                "continue it with `tandem run --resume {dir}`, or pass --output-dir NEW_DIR"
            )),
        );
    }
    std::fs::create_dir_all(&opts.run_dir).map_err(RlError::io(format!("creating {dir}")))?;
    let meta = serde_json::json!({
        "job": plan.job.path,
        "name": plan.name,
    });
    std::fs::write(&files.run_json, meta.to_string())
        .map_err(RlError::io(format!("writing {}", files.run_json.display())))?;
    let copy = opts.run_dir.join("job.toml");
    std::fs::write(&copy, &plan.job.text)
        .map_err(RlError::io(format!("writing {}", copy.display())))
}

/// The job file a run directory was started from (`run.json`).
pub fn job_of_run(run_dir: &Path) -> Result<PathBuf, RlError> {
    let path = RunFiles::of(run_dir).run_json;
    let text = std::fs::read_to_string(&path).map_err(|_| {
        RlError::usage(format!(
            "--resume {}: not a run directory (no run.json); give the run directory `tandem run` wrote",
            run_dir.display()
        ))
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| RlError::usage(format!("{}: {e}", path.display())))?;
    v.get("job")
        .and_then(|j| j.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| RlError::usage(format!("{}: no `job` entry", path.display())))
}
