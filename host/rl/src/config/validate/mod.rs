//! Cross-checks of a parsed job file against itself, the plugin registry and the model
//! directory, producing the resolved plan `tandem check` prints. It is the one validation of a
//! job: `tandem run` calls it before it creates anything (run directory, model, workers), so
//! every check the run would otherwise make later lives here.
//!
//! One module per section, run in this order: `run` (the restart budget), `placement` (memory fractions, devices, the
//! engine and trainer components and the trainer's ranks), `bridge` (settings as the sync
//! driver parses them, the update kind both components must declare), `launcher` (what
//! Slurm needs; what a placement across hosts rules out), `model`, `task` (with
//! the chat template of a chat task), `eval`, `algorithm`, `drafter` (a drafter job's
//! components, bridge and held-out set), `transport` (plan, timeout,
//! `[memory]`), `plugin_options` (each plugin's `validate_config` on its options, with rank
//! 0's component config as the run builds it).
//! All problems are collected, one line each, each pointing at its key in the job file, and
//! reported in file order (`issues`).

mod algorithm;
mod bridge;
mod drafter;
mod eval;
mod issues;
mod launcher;
mod model;
mod placement;
mod plugin_options;
mod run;
mod task;
mod transport;

#[cfg(test)]
mod tests;

use super::plan::{Overrides, ResolvedPlan};
use super::{ConfigError, LoadedJob};
use issues::Issues;
use plugin_options::{Options, Site};
use tandem_plugin_api::ComponentKind;
use tandem_runtime::registry::Registry;

/// The checks of `[task]` and `[eval]` that need no model and no plugin (what `tandem eval
/// --job` reads of a job file).
pub fn validate_task_and_eval(job: &LoadedJob) -> Result<(), ConfigError> {
    let mut issues = Issues::new(job);
    task::check(&mut issues, &job.job);
    eval::check(&mut issues, &job.job);
    if issues.is_empty() {
        Ok(())
    } else {
        Err(issues.into_error())
    }
}

/// Validates `job` against itself and `registry`, with the job's own run directory.
pub fn validate(job: &LoadedJob, registry: &Registry) -> Result<ResolvedPlan, ConfigError> {
    validate_with(job, registry, &Overrides::default())
}

/// Validates `job` against itself and `registry` as it will run with `overrides`.
pub fn validate_with(
    job: &LoadedJob,
    registry: &Registry,
    overrides: &Overrides,
) -> Result<ResolvedPlan, ConfigError> {
    let j = &job.job;
    let mut issues = Issues::new(job);
    run::check(&mut issues, &j.run);
    let devices_ok = placement::check(&mut issues, &j.placement);
    let (engine, trainer) = placement::components(&mut issues, registry, j);
    bridge::check(&mut issues, j, registry, &engine, &trainer);
    let launcher = launcher::check(&mut issues, j, registry);
    let model_path = job.resolve_path(&j.model.path);
    model::check(
        &mut issues,
        registry,
        &model_path,
        j.model.init_preset.as_deref(),
    );
    task::check(&mut issues, j);
    task::check_chat(&mut issues, j, &model_path);
    eval::check(&mut issues, j);
    algorithm::check(&mut issues, &j.algorithm);
    drafter::check(&mut issues, registry, j);
    let drafter_trainer = drafter::check_rl(&mut issues, registry, j);
    let transport_groups = transport::check(&mut issues, j, devices_ok);
    let output_dir = overrides
        .output_dir
        .clone()
        .unwrap_or_else(|| job.resolve_path(&j.run.output_dir));
    let site = Site {
        registry,
        model_path: &model_path,
        devices: &j.placement.devices,
        run_dir: &output_dir,
    };
    let drafter_resolved = drafter_trainer.as_ref().map(|c| (c.clone(), ()));
    for (kind, section, resolved, table) in [
        (
            ComponentKind::Engine,
            "engine",
            engine.as_ref().map(|(c, _)| c),
            &j.engine.options,
        ),
        (
            ComponentKind::Trainer,
            "trainer",
            trainer.as_ref().map(|(c, _)| c),
            &j.trainer.options,
        ),
        (
            ComponentKind::Trainer,
            "drafter",
            drafter_resolved.as_ref().map(|(c, _)| c),
            &j.drafter.options,
        ),
    ] {
        if let Some(component) = resolved {
            let options = Options {
                kind,
                section,
                component,
                table,
            };
            plugin_options::check(&mut issues, &site, &options);
        }
    }
    let (Some((engine, _)), Some((trainer, _))) = (engine, trainer) else {
        return Err(issues.into_error());
    };
    if !issues.is_empty() {
        return Err(issues.into_error());
    }
    let p = &j.placement;
    Ok(ResolvedPlan {
        name: j.run.name.clone(),
        output_dir,
        model_path,
        model_init_preset: j.model.init_preset.clone(),
        placement: p.mode,
        devices: p.devices.clone(),
        train_frac: *p.train_frac.get_ref(),
        infer_frac: *p.infer_frac.get_ref(),
        engine,
        trainer,
        bridge: bridge::resolved(j, registry),
        transport: j.transport.backend.clone(),
        transport_groups,
        launcher,
        drafter: drafter::describe(j),
        drafter_trainer,
    })
}
