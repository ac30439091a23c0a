//! `tandem run JOB.toml`: validate, prepare the run directory, and run the job.

use crate::error::HostError;
use std::path::{Path, PathBuf};

pub(super) fn run(
    cli_dirs: &[PathBuf],
    job_path: &Path,
    output_dir: Option<PathBuf>,
    json: bool,
) -> Result<(), HostError> {
    let (_, mut plan) = super::check::resolve(cli_dirs, job_path)?;
    if let Some(dir) = output_dir {
        plan.output_dir = dir;
    }
    if json {
        super::print_json(&plan)?;
    } else {
        println!("{}", super::check::describe(&plan));
    }
    Err(HostError::Runtime(
        "the RL loop is not part of this build yet: `tandem run` validated the job and stops here"
            .into(),
    ))
}
