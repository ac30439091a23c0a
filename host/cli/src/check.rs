//! `tandem check JOB.toml [--json]`: validate a job file and print the resolved plan.

use crate::error::CliError;
use std::path::{Path, PathBuf};
use tandem_rl::config::{LoadedJob, Overrides, ResolvedPlan, validate_with};
use tandem_runtime::registry::Registry;

/// A job file, parsed and validated, with the registry it was validated against (the one
/// registry of the process: `tandem run` constructs every component through it).
pub(super) struct Resolved {
    /// The parsed job file.
    pub job: LoadedJob,
    /// What it resolved to.
    pub plan: ResolvedPlan,
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

/// Human-readable plan.
pub(super) fn describe(plan: &ResolvedPlan) -> String {
    let mut out = vec![
        format!("job `{}` is valid", plan.name),
        format!("  run dir    {}", plan.output_dir.display()),
        format!(
            "  model      {}{}",
            plan.model_path.display(),
            plan.model_init_preset
                .as_ref()
                .map(|p| format!(" (created from preset `{p}` if absent)"))
                .unwrap_or_default()
        ),
        format!(
            "  placement  {:?} on {} (train {:.2}, infer {:.2} of each device)",
            plan.placement,
            plan.devices.join(", "),
            plan.train_frac,
            plan.infer_frac
        )
        .to_lowercase(),
        format!(
            "  engine     {} x{} from plugin `{}` ({})",
            plan.engine.component, plan.engine.ranks, plan.engine.plugin, plan.engine.source
        ),
        format!(
            "  trainer    {} x{} from plugin `{}` ({})",
            plan.trainer.component, plan.trainer.ranks, plan.trainer.plugin, plan.trainer.source
        ),
        format!(
            "  bridge     {} from plugin `{}`: trainer exports {}, engines apply {} (verify {})",
            plan.bridge.mode,
            plan.bridge.provider.as_deref().unwrap_or("?"),
            plan.bridge.export_kind,
            plan.bridge.apply_kind,
            if plan.bridge.verify { "on" } else { "off" },
        ),
        format!("  launcher   {}", plan.launcher),
        format!("  transport  {}", plan.transport),
    ];
    out.extend(plan.transport_groups.iter().map(|g| format!("    {g}")));
    if let Some(d) = &plan.drafter {
        out.push(format!("  drafter    {d}"));
    }
    out.retain(|l| !l.is_empty());
    out.join("\n")
}

pub(super) fn run(cli_dirs: &[PathBuf], job_path: &Path, json: bool) -> Result<(), CliError> {
    let Resolved { plan, .. } = resolve(cli_dirs, job_path, &Overrides::default())?;
    if json {
        super::print_json(&plan)
    } else {
        println!("{}", describe(&plan));
        Ok(())
    }
}
