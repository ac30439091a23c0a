//! Cross-checks of a parsed job file against itself, the plugin registry and the model
//! directory, producing the resolved plan `tandem check` prints. It is the one validation of a
//! job: `tandem run` calls it before it creates anything (run directory, model, workers), so
//! every check the run would otherwise make later lives here.
//!
//! One module per section, run in this order: `run` (the restart budget), `placement` (memory fractions, devices, the
//! engine and trainer components and the trainer's ranks), `launcher` (what
//! Slurm needs; what a placement across hosts rules out), `model`, `environment` (built,
//! starting nothing; the chat template of a chat environment), `tools` (multi-turn rollouts), `eval`, `algorithm`, `drafter` (a drafter job's
//! components, bridge and held-out set), `critic` (PPO's value model), `transport` (plan, timeout,
//! `[memory]`), `logging` (the trackers: an MLflow address, the W&B sidecar's
//! Python), `roles` (each role's options made into JSON once, checked by its plugin's
//! `validate_config` with rank 0's component config as the run builds it, and the
//! capabilities the component has with them), then `bridge` (the bridge, its plan, and the
//! update kinds and digests both sides must have with their options), the critic's and
//! PPO actor's capabilities, `staleness` (`max_staleness` and `correction` against the
//! placement, the bridge and the trainer), and `fit` (what the
//! components' capabilities rule out: sequences longer than the engine holds, a drafter job's
//! bridge and draft tokens).
//! All problems are collected, one line each, each pointing at its key in the job file, and
//! reported in file order (`issues`).

mod algorithm;
mod bridge;
mod critic;
mod drafter;
mod environment;
mod eval;
mod fit;
mod issues;
mod launcher;
mod logging;
mod model;
mod placement;
mod roles;
mod run;
mod staleness;
mod tools;
mod transport;

#[cfg(test)]
mod tests;

use super::plan::{
    DrafterJobPlan, DrafterPlan, EvalPlan, JobRecord, LauncherPlan, ModelPlan, Overrides,
    PlacementPlan, RlDrafterPlan, RunPlan, TransportPlan, absolute,
};
use super::{ConfigError, LoadedJob};
use issues::Issues;
use roles::{Role, Site};
use tandem_plugin_api::ComponentKind;
use tandem_runtime::registry::Registry;

/// The checks of `[environment]` and `[eval]` that need no model (what `tandem eval --job`
/// reads of a job file).
pub fn validate_task_and_eval(job: &LoadedJob, registry: &Registry) -> Result<(), ConfigError> {
    let mut issues = Issues::new(job);
    environment::check(&mut issues, registry, job);
    eval::check(&mut issues, &job.job);
    if issues.is_empty() {
        Ok(())
    } else {
        Err(issues.into_error())
    }
}

/// Validates `job` against itself and `registry`, with the job's own run directory.
pub fn validate(job: &LoadedJob, registry: &Registry) -> Result<RunPlan, ConfigError> {
    validate_with(job, registry, &Overrides::default())
}

/// Validates `job` against itself and `registry` as it will run with `overrides`: the plan
/// `tandem check` prints and `tandem run` executes.
pub fn validate_with(
    job: &LoadedJob,
    registry: &Registry,
    overrides: &Overrides,
) -> Result<RunPlan, ConfigError> {
    let j = &job.job;
    let mut issues = Issues::new(job);
    run::check(&mut issues, &j.run);
    let devices_ok = placement::check(&mut issues, &j.placement);
    placement::check_cpus(&mut issues, j);
    let (engine, trainer) = placement::components(&mut issues, registry, j);
    let launcher = launcher::check(&mut issues, j, registry);
    let model_path = job.resolve_path(&j.model.path);
    model::check(
        &mut issues,
        registry,
        &model_path,
        j.model.init_preset.as_deref(),
    );
    let env = environment::check(&mut issues, registry, job);
    environment::check_chat(&mut issues, j, &model_path, env.as_ref());
    tools::check(&mut issues, j);
    eval::check(&mut issues, j);
    algorithm::check(&mut issues, j);
    drafter::check(&mut issues, registry, j);
    let drafter_trainer = drafter::check_rl(&mut issues, registry, j);
    let critic = critic::check(&mut issues, registry, j);
    let transport_groups = transport::check(&mut issues, j, devices_ok);
    logging::check(&mut issues, j);
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
    let colocated = j.placement.mode == super::PlacementMode::Colocate;
    let engine = engine.and_then(|found| {
        let role = Role {
            kind: ComponentKind::Engine,
            section: "engine",
            found,
            table: &j.engine.options,
            ranks: j.engine.ranks,
            first_device: 0,
            needs_offload: colocated && j.engine.needs_offload,
        };
        roles::plan(&mut issues, &site, role)
    });
    let trainer = trainer.and_then(|found| {
        let role = Role {
            kind: ComponentKind::Trainer,
            section: "trainer",
            found,
            table: &j.trainer.options,
            ranks: j.trainer.ranks,
            first_device: 0,
            needs_offload: false,
        };
        roles::plan(&mut issues, &site, role)
    });
    let drafter_trainer = drafter_trainer.and_then(|found| {
        let role = Role {
            kind: ComponentKind::Trainer,
            section: "drafter",
            found,
            table: &j.drafter.options,
            ranks: 1,
            // The drafter trainer is trainer rank N after the policy's N ranks, on rank 0's
            // device.
            first_device: 0,
            needs_offload: false,
        };
        roles::plan(&mut issues, &site, role)
    });
    let critic = critic.zip(j.critic.as_ref()).and_then(|(found, c)| {
        let role = Role {
            kind: ComponentKind::Trainer,
            section: "critic",
            found,
            table: &c.options,
            ranks: 1,
            first_device: 0,
            needs_offload: false,
        };
        roles::plan(&mut issues, &site, role)
    });
    let bridge = bridge::check(&mut issues, j, registry, engine.as_ref(), trainer.as_ref());
    staleness::check(&mut issues, j, bridge.as_ref(), trainer.as_ref());
    if let Some(t) = &trainer {
        algorithm::check_trainer(&mut issues, &j.algorithm, t);
        critic::check_caps(&mut issues, j, critic.as_ref(), t);
    }
    let eval = j.eval.enabled().then(|| EvalPlan {
        every: j.eval.every,
        problems: j.eval.problems,
        max_tokens: j.eval.max_tokens.unwrap_or(j.algorithm.max_tokens),
    });
    if let (Some(e), Some(b)) = (&engine, &bridge) {
        fit::check(&mut issues, j, &model_path, e, b, env.as_ref());
    }
    let (Some(engine), Some(trainer), Some(bridge)) = (engine, trainer, bridge) else {
        return Err(issues.into_error());
    };
    if !issues.is_empty() {
        return Err(issues.into_error());
    }
    let d = &j.drafter;
    let drafter = DrafterPlan {
        job: j.is_drafter_job().then(|| DrafterJobPlan {
            route: d.route,
            eval_every: d.eval_every,
            eval_prompts: d.eval_prompts,
            eval_max_tokens: d.eval_max_tokens.unwrap_or(j.algorithm.max_tokens),
            ignore_eos: d.ignore_eos,
            draft_tokens: engine.caps.draft_tokens,
        }),
        rl: drafter_trainer.map(|trainer| RlDrafterPlan {
            trainer,
            train_in: d.train_in,
            max_steps_per_bubble: d.max_steps_per_bubble,
            min_steps_per_bubble: d.min_steps_per_bubble,
            min_ranks_for_training: d.min_ranks_for_training,
            train_every_n_steps: d.train_every_n_steps,
            learning_rate: d.learning_rate,
            activation_timeout_secs: d.activation_timeout_secs,
            min_acceptance: d.min_acceptance,
            draft_tokens: engine.caps.draft_tokens,
            max_seq_len: engine.caps.max_seq_len,
        }),
    };
    let p = &j.placement;
    let tracking = j.logging.plan(
        &output_dir,
        job.path.parent().unwrap_or(std::path::Path::new(".")),
    );
    Ok(RunPlan {
        name: j.run.name.clone(),
        job: JobRecord {
            path: absolute(&job.path),
            text: job.source.clone(),
        },
        output_dir,
        run: j.run.clone(),
        model: ModelPlan {
            path: model_path,
            init_preset: j.model.init_preset.clone(),
            warm_start_steps: j.model.warm_start_steps,
        },
        placement: PlacementPlan {
            mode: p.mode,
            devices: p.devices.clone(),
            train_frac: *p.train_frac.get_ref(),
            infer_frac: *p.infer_frac.get_ref(),
            cpus: p.cpus.clone(),
        },
        engine,
        trainer,
        critic,
        bridge,
        algorithm: j.algorithm.clone(),
        environment: environment::plan(job),
        eval,
        drafter,
        memory: j.memory.clone(),
        transport: TransportPlan {
            backend: j.transport.backend.clone(),
            timeout_secs: j.transport.timeout_secs,
            groups: transport_groups,
        },
        launcher: LauncherPlan {
            settings: j.launcher.clone(),
            summary: launcher,
        },
        tracking,
    })
}
