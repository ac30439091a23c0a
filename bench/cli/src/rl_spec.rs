//! `tandem bench loop`, speculative long tail: the quickstart with two engine ranks and a
//! long tail (one problem in eight asks for its answer written 32 times), run twice with the
//! same seed — the drafter off, then on (trained in the rollouts' bubbles, the engines
//! speculating while at most 16 rows decode and the acceptance length stays at 2.5 or
//! above) — and compared after warm-up: rollout time per
//! step (on beside off; target ≥ 1.3× shorter), the drafter's work outside the bubbles per
//! step (beside the step time; target ≤ 5 %), the bubble time used beside the bubble time
//! available, the acceptance length beside its bound, and the mean reward (on beside off: the
//! same within noise, speculation keeps the distribution).

use super::Figure;
use std::path::Path;
use tandem_cli::error::CliError;
use tandem_rl::metrics::StepMetrics;
use tandem_runtime::registry::Registry;

const JOB: &str = r#"
[run]
name = "bench-spec"
output_dir = "run"
steps = STEPS
seed = 0
save_every = 0

[placement]
mode = "colocate"

[model]
path = "model-spec"
init_preset = "tiny"
warm_start_steps = 60

[engine]
plugin = "native"
ranks = 2

[engine.options]
max_batch = 64
max_seq_len = 64
draft_tokens = 4

[trainer]
plugin = "native"

[bridge]
mode = "ipc"

[algorithm]
prompts_per_step = 16
group_size = 8
max_tokens = 24
temperature = 1.0
learning_rate = 0.0003

[task]
kind = "arithmetic"

[task.options]
max_operand = 3
reward = "exact"
long_tail = 0.125
long_repeat = 32

[drafter]
enabled = ENABLED
max_steps_per_bubble = 4
speculate_below_batch = 16
min_acceptance = 2.5

[drafter.options]
ttt_steps = 4
max_tokens = 512
"#;

/// Draft tokens per round in [`JOB`]: an acceptance length is at most this + 1.
const DRAFT_TOKENS: f64 = 4.0;

/// Runs the comparison in `tmp` (`steps` per run, the first third warm-up).
pub(super) fn run(registry: &Registry, tmp: &Path, steps: u32) -> Result<Vec<Figure>, CliError> {
    let off = steady(&run_job(registry, tmp, false, steps)?, steps);
    let on = steady(&run_job(registry, tmp, true, steps)?, steps);
    let mean = |ms: &[StepMetrics], f: &dyn Fn(&StepMetrics) -> f64| {
        ms.iter().map(f).sum::<f64>() / ms.len().max(1) as f64
    };
    let phase =
        |name: &'static str| move |m: &StepMetrics| m.phases.get(name).copied().unwrap_or(0.0);
    let rollout_off = mean(&off, &phase("generate"));
    let rollout_on = mean(&on, &phase("generate"));
    let step_on = mean(&on, &|m| m.step_s);
    let outside = mean(&on, &|m| phase("drafter")(m) + phase("drafter_sync")(m));
    let bubble = mean(&on, &|m| m.bubble_s);
    let used = mean(&on, &|m| m.bubble_used_s.unwrap_or(0.0));
    let accepts: Vec<f64> = on.iter().filter_map(|m| m.acceptance_length).collect();
    let accept = accepts.iter().sum::<f64>() / accepts.len().max(1) as f64;
    let speculated = format!(
        "spec: acceptance length ({} of {} steps speculated)",
        accepts.len(),
        on.len()
    );
    let reward_off = mean(&off, &|m| m.reward_mean);
    let reward_on = mean(&on, &|m| m.reward_mean);
    Ok(vec![
        Figure::new(
            "loop",
            "spec: rollout per step, drafter on",
            rollout_on * 1e3,
            "ms",
            rollout_off * 1e3,
        )
        .limit_name("drafter off")
        .target("<= 0.77 (1.3x shorter)"),
        Figure::new(
            "loop",
            "spec: drafter work outside the bubbles",
            outside * 1e3,
            "ms",
            step_on * 1e3,
        )
        .limit_name("step time")
        .target("<= 0.05"),
        Figure::new(
            "loop",
            "spec: bubble time used for drafter steps",
            used * 1e3,
            "ms",
            bubble * 1e3,
        )
        .limit_name("bubble time (engine-s idle)"),
        Figure::new("loop", &speculated, accept, "tokens", DRAFT_TOKENS + 1.0)
            .limit_name("draft tokens + 1"),
        Figure::new(
            "loop",
            "spec: mean reward, drafter on",
            reward_on,
            "",
            reward_off,
        )
        .limit_name("drafter off")
        .target("~1 (within noise)"),
    ])
}

/// The steps after warm-up (the first third: the drafter's first steps, first allocations).
fn steady(ms: &[StepMetrics], steps: u32) -> Vec<StepMetrics> {
    ms.iter().skip((steps / 3) as usize).cloned().collect()
}

/// Runs the job with the drafter on or off; its metrics.
fn run_job(
    registry: &Registry,
    tmp: &Path,
    on: bool,
    steps: u32,
) -> Result<Vec<StepMetrics>, CliError> {
    let name = if on { "spec-on" } else { "spec-off" };
    let text = JOB
        .replace("STEPS", &steps.to_string())
        .replace("ENABLED", if on { "true" } else { "false" });
    let run_dir = super::rl_loop::run_text(registry, tmp, name, &text, None, false)?;
    Ok(super::rl_loop::metrics(&run_dir))
}
