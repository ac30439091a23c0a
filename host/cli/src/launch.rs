//! `tandem launch --sbatch JOB.toml [--out FILE]`: the `sbatch` script that submits a job with
//! `[launcher] kind = "slurm"`: an allocation of the nodes the job names (one task per worker)
//! whose batch step runs `tandem run` — the controller on the first node, each worker an
//! `srun` step inside the allocation. Printed on stdout, or written to `--out` (never over an
//! existing file).

use crate::check::{Resolved, resolve};
use crate::error::CliError;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tandem_rl::config::{LauncherKind, Overrides};

/// Arguments of `tandem launch`.
#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// The job file (with `[launcher] kind = "slurm"`).
    pub job: PathBuf,
    /// Print (or write) an `sbatch` script for the job.
    #[arg(long, required = true)]
    pub sbatch: bool,
    /// Write the script here instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub(super) fn run(cli_dirs: &[PathBuf], args: LaunchArgs) -> Result<(), CliError> {
    let Resolved { plan, .. } = resolve(cli_dirs, &args.job, &Overrides::default())?;
    let l = &plan.launcher.settings;
    if l.kind != LauncherKind::Slurm {
        return Err(CliError::usage(format!(
            "{}: `tandem launch --sbatch` needs [launcher] kind = \"slurm\"",
            args.job.display()
        ))
        .with_help("add a [launcher] table (see README, \"On a cluster\")"));
    }
    let exe = std::env::current_exe().map_err(CliError::io("finding the tandem executable"))?;
    let job_path = absolute(&args.job)?;
    let drafter = u32::from(plan.drafter.rl.is_some());
    let tasks = plan.engine.world_size() + plan.trainer.world_size() + drafter;
    let nodes: BTreeSet<&str> = l
        .engine_nodes
        .iter()
        .chain(&l.trainer_nodes)
        .map(String::as_str)
        .collect();
    let mut lines = vec![
        "#!/bin/bash".to_owned(),
        format!("# tandem launch --sbatch {}", args.job.display()),
        format!("#SBATCH --job-name=tandem-{}", plan.name),
        format!("#SBATCH --ntasks={tasks}"),
    ];
    if !nodes.is_empty() {
        lines.push(format!("#SBATCH --nodes={}", nodes.len()));
        let list: Vec<&str> = nodes.into_iter().collect();
        lines.push(format!("#SBATCH --nodelist={}", list.join(",")));
    }
    if let Some(p) = &l.partition {
        lines.push(format!("#SBATCH --partition={p}"));
    }
    let dir = job_path.parent().unwrap_or(Path::new("/"));
    lines.push(format!(
        "#SBATCH --output={}/slurm-{}-%j.out",
        dir.display(),
        plan.name
    ));
    lines.push("set -euo pipefail".to_owned());
    lines.push(format!("cd {}", quote(dir)));
    let mut cmd = vec![quote(&exe), "run".to_owned(), quote(&job_path)];
    for d in cli_dirs {
        cmd.push("--plugin-dir".to_owned());
        cmd.push(quote(&absolute(d)?));
    }
    lines.push(format!("exec {}", cmd.join(" ")));
    let script = lines.join("\n") + "\n";
    match &args.out {
        None => print!("{script}"),
        Some(out) => {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(out)
                .map_err(CliError::io(format!("creating {}", out.display())))?;
            f.write_all(script.as_bytes())
                .map_err(CliError::io(format!("writing {}", out.display())))?;
            eprintln!(
                "wrote {}; submit it with: sbatch {}",
                out.display(),
                out.display()
            );
        }
    }
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf, CliError> {
    std::path::absolute(p).map_err(CliError::io(format!("resolving {}", p.display())))
}

/// `p` single-quoted for the shell.
fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}
