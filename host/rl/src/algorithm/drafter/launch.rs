//! Launching a drafter job: the run directory, the target model, the held-out prompts, the
//! rendezvous store, then the workers (every engine rank started and health-checked, the
//! trainer initialised) each with its place in the transport world.

use super::DrafterLoop;
use super::metrics::DrafterMetricsLog;
use crate::config::RunPlan;
use crate::driver::RunOptions;
use crate::driver::launch::Launch;
use crate::driver::skeleton;
use crate::driver::world::World;
use crate::error::RlError;
use crate::progress::Progress;
use tandem_control::protocol::Role;
use tandem_plugin_api::stats as hidden_stats;
use tandem_runtime::launch::RemoteTrainer;
use tandem_runtime::registry::Registry;

/// Name of the transport group of engine rank `i` and the trainer.
pub(super) fn pair_group(i: usize) -> String {
    format!("pair{i}")
}

impl<'a> DrafterLoop<'a> {
    /// Prepares the run and starts its workers; on return the trainer is initialised and the
    /// engines serve the target.
    pub(super) fn launch(
        plan: &'a RunPlan,
        registry: &Registry,
        opts: &'a RunOptions,
    ) -> Result<DrafterLoop<'a>, RlError> {
        let d =
            plan.drafter.job.as_ref().ok_or_else(|| {
                RlError::usage("not a drafter job ([algorithm] name = \"drafter\")")
            })?;
        // The training stream leaves out the held-out prompts acceptance is measured on.
        let p = skeleton::prepare(plan, registry, opts, Some(d.eval_prompts))?;
        let (env, codec, launcher, files, events) = (p.env, p.codec, p.launcher, p.files, p.events);
        let held_out = env
            .held_out(d.eval_prompts)?
            .iter()
            .map(|p| codec.prompt_of(p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut launcher = launcher;
        let launch = Launch { plan, opts };
        let world = World::start(
            &launcher,
            "drafter",
            plan.engine.world_size() + 1,
            groups(plan.engine.world_size()),
            &plan.transport.backend,
            plan.transport.timeout_secs,
        )?;
        let engine_specs = (0..plan.engine.world_size())
            .map(|r| {
                let mut s = launch.spec(Role::Engine, r);
                s.transport = Some(world.spec(1 + r));
                s
            })
            .collect::<Vec<_>>();
        let mut trainer_spec = launch.spec(Role::Trainer, 0);
        trainer_spec.transport = Some(world.spec(0));
        let engines = launcher.spawn_engines(&engine_specs)?;
        let trainer = launcher
            .spawn_trainers(&[trainer_spec])?
            .pop()
            .ok_or_else(|| RlError::failed("the trainer worker did not start"))?;
        crate::driver::launch::start_engines(&engines, &events)?;
        let info = trainer.init()?;
        events.record(
            0,
            "trainer",
            "init",
            &format!("{} params", info.trainable_params),
        );
        let DrafterInputs { layers, width, .. } = drafter_inputs(&trainer)?;
        let metrics = DrafterMetricsLog::create(&files.metrics)?;
        let total = opts.steps.unwrap_or(plan.run.steps);
        Ok(DrafterLoop {
            plan,
            settings: d,
            opts,
            env,
            codec,
            held_out,
            launcher,
            _world: world,
            engines,
            trainer,
            layers,
            width,
            events,
            metrics,
            progress: Progress::new(1, total, opts.progress),
            files,
            data_position: 0,
            last_checkpoint: None,
            total,
        })
    }
}

/// The groups of a drafter job's world: the trainer is world rank 0, engine `i` is `1 + i`;
/// `world` holds everyone, `pair<i>` engine `i` and the trainer.
fn groups(engines: u32) -> Vec<(String, Vec<u32>)> {
    let mut groups = vec![("world".to_string(), (0..=engines).collect())];
    for i in 0..engines {
        groups.push((pair_group(i as usize), vec![1 + i, 0]));
    }
    groups
}

/// What the trainer's drafter reads, as the trainer reports it (`drafter.aux_layer.<i>`,
/// `drafter.feature_width`, `drafter.max_rows`).
pub(crate) struct DrafterInputs {
    /// The layers its features are taken from, in row order.
    pub layers: Vec<u32>,
    /// f32 values per feature row.
    pub width: u32,
    /// Most feature rows one step may carry (`None`: the trainer does not say).
    pub max_rows: Option<u64>,
}

/// The drafter trainer's inputs ([`DrafterInputs`]).
pub(crate) fn drafter_inputs(trainer: &RemoteTrainer) -> Result<DrafterInputs, RlError> {
    let stats = trainer.stats()?;
    let get = |name: &str| {
        stats
            .metrics
            .iter()
            .find(|m| m.name.as_str() == name)
            .map(|m| m.value)
    };
    let mut layers = Vec::new();
    while let Some(v) = get(&format!("{}{}", hidden_stats::AUX_LAYER, layers.len())) {
        layers.push(v as u32);
    }
    let width = get(hidden_stats::FEATURE_WIDTH).unwrap_or(0.0) as u32;
    if layers.is_empty() || width == 0 {
        return Err(RlError::failed(
            "the trainer does not report its drafter's inputs (drafter.aux_layer.<i>, \
             drafter.feature_width in its stats); is it a drafter trainer ([trainer] plugin of a drafter job, [drafter] plugin of an RL job)?",
        ));
    }
    Ok(DrafterInputs {
        layers,
        width,
        max_rows: get(hidden_stats::MAX_ROWS).map(|v| v.max(1.0) as u64),
    })
}
