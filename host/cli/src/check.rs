//! `tandem check JOB.toml [--json]`: validate a job file and print the resolved plan.

use crate::error::CliError;
use std::path::{Path, PathBuf};
use tandem_rl::config::{LoadedJob, Overrides, RunPlan, validate_with};
use tandem_runtime::registry::Registry;

/// A job file, parsed and validated, with the registry it was validated against (the one
/// registry of the process: `tandem run` constructs every component through it).
pub(super) struct Resolved {
    /// The parsed job file (`[plugins] dirs`, `[launcher]` for `tandem launch`).
    pub job: LoadedJob,
    /// What it resolved to: all a run executes.
    pub plan: RunPlan,
    /// The plugins.
    pub registry: Registry,
}

/// Parses and validates a job file against the registry: every check `tandem run` makes
/// before it creates anything (the same call starts `tandem run`).
pub(super) fn resolve(
    cli_dirs: &[PathBuf],
    job_path: &Path,
    overrides: &Overrides,
) -> Result<Resolved, CliError> {
    let job = LoadedJob::read(job_path)?;
    let registry = super::load_registry(cli_dirs, &job_dirs(&job))?;
    let plan = validate_with(&job, &registry, overrides)?;
    Ok(Resolved {
        job,
        plan,
        registry,
    })
}

/// The job file's `[plugins] dirs`, relative to the job file.
pub(super) fn job_dirs(job: &LoadedJob) -> Vec<PathBuf> {
    job.job
        .plugins
        .dirs
        .iter()
        .map(|d| job.resolve_path(d))
        .collect()
}

pub(super) fn run(cli_dirs: &[PathBuf], job_path: &Path, json: bool) -> Result<(), CliError> {
    let Resolved { plan, .. } = resolve(cli_dirs, job_path, &Overrides::default())?;
    if json {
        super::print_json(&plan)
    } else {
        print!("{plan}");
        Ok(())
    }
}
