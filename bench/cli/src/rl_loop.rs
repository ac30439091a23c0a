//! `tandem bench loop`: a short colocated GRPO run on a tiny model (real workers; `ipc` and
//! `checkpoint` bridges), reporting the orchestration overhead — step time spent outside plugin calls
//! (rollout bookkeeping, rewards, advantages, metrics) — beside the step time of the same
//! run, and each phase's share of the step; then the `ipc` run twice more with a worker
//! SIGKILLed every third step (an engine rank during its rollout; the trainer during its
//! train phase), reporting the time to recover from each death (restart, checkpoint and
//! replay, re-sync: the `recovered` events) beside the step time of the run without deaths;
//! then the speculative long tail, the drafter off beside on (`rl_spec.rs`).

use super::Figure;
use std::path::{Path, PathBuf};
use tandem_cli::error::CliError;
use tandem_rl::config::LoadedJob;
use tandem_rl::metrics::StepMetrics;
use tandem_rl::warmstart::create_preset;
use tandem_rl::{self, RunOptions};
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;

const JOB: &str = r#"
[run]
name = "bench-loop"
output_dir = "run"
steps = STEPS
seed = 0
save_every = 4
restart_backoff_secs = 0.0
max_restarts = 10
max_restarts_per_run = 20

[placement]
mode = "colocate"

[model]
path = "model"

[engine]
plugin = "native"

[engine.options]
max_batch = 64
max_seq_len = 64

[trainer]
plugin = "native"

[bridge]
mode = "BRIDGE"

[algorithm]
prompts_per_step = 8
group_size = 8
max_tokens = 6

[task]
kind = "arithmetic"
"#;

/// Runs the benchmark (`quick`: fewer steps).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let steps = if quick { 6 } else { 20 };
    in_scratch("loop", |tmp| run_in(tmp, steps))
}

/// Runs `f` in a fresh `<temp>/tandem-bench-<name>-<pid>` directory, removed afterwards.
pub(super) fn in_scratch<T>(
    name: &str,
    f: impl FnOnce(&Path) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let tmp = std::env::temp_dir().join(format!("tandem-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(CliError::io(format!("creating {}", tmp.display())))?;
    let result = f(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn run_in(tmp: &std::path::Path, steps: u32) -> Result<Vec<Figure>, CliError> {
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    create_preset(&registry, &tmp.join("model"), "tiny", 0)?;
    let mut figures = Vec::new();
    let mut ipc_step_s = 0.0;
    for bridge in ["ipc", "checkpoint"] {
        let run_dir = run_job(&registry, tmp, bridge, steps, None)?;
        let ms = metrics(&run_dir);
        // Step 1 carries one-off costs (first allocations); the steady state is what counts.
        let steady: Vec<&StepMetrics> = ms.iter().skip(1).collect();
        let n = steady.len().max(1) as f64;
        let step_s = steady.iter().map(|m| m.step_s).sum::<f64>() / n;
        if bridge == "ipc" {
            ipc_step_s = step_s;
        }
        let overhead = steady.iter().map(|m| m.overhead_s).sum::<f64>() / n;
        figures.push(
            Figure::new(
                "loop",
                &format!("{bridge}: orchestration overhead"),
                overhead * 1e3,
                "ms",
                step_s * 1e3,
            )
            .limit_name("step time")
            .target("<= 0.02"),
        );
        let mut phases: std::collections::BTreeMap<String, f64> = Default::default();
        for m in &steady {
            for (k, v) in &m.phases {
                *phases.entry(k.clone()).or_default() += v / n;
            }
        }
        for (k, v) in phases {
            figures.push(
                Figure::new(
                    "loop",
                    &format!("{bridge}: phase {k}"),
                    v * 1e3,
                    "ms",
                    step_s * 1e3,
                )
                .limit_name("step time"),
            );
        }
    }
    for (victim, at, who) in [
        ("engine", "rollout", "an engine"),
        ("trainer", "train", "the trainer"),
    ] {
        let chaos = format!("seed=1,every=3,victim={victim},at={at}");
        let run_dir = run_job(&registry, tmp, "ipc", steps.max(7), Some(chaos))?;
        let times = recovery_times(&run_dir);
        let n = times.len().max(1) as f64;
        figures.push(
            Figure::new(
                "loop",
                &format!("ipc: recovery, {who} killed ({} deaths)", times.len()),
                times.iter().sum::<f64>() / n * 1e3,
                "ms",
                ipc_step_s * 1e3,
            )
            .limit_name("step time"),
        );
    }
    figures.extend(super::rl_spec::run(&registry, tmp, steps.max(12) * 2)?);
    Ok(figures)
}

/// Runs the job through `bridge` for `steps` steps (with a kill schedule); its run dir.
fn run_job(
    registry: &Registry,
    tmp: &Path,
    bridge: &str,
    steps: u32,
    chaos: Option<String>,
) -> Result<PathBuf, CliError> {
    let name = match &chaos {
        Some(c) => format!("{bridge}-{}", c.replace([',', '='], "-")),
        None => bridge.to_string(),
    };
    let text = JOB
        .replace("STEPS", &steps.to_string())
        .replace("BRIDGE", bridge);
    run_text(registry, tmp, &name, &text, chaos, false)
}

/// Writes the job `text` as `<tmp>/<name>.toml` and runs it (with a kill schedule; with a
/// progress bar on stderr when `progress`) into `<tmp>/run-<name>`; that run dir.
pub(super) fn run_text(
    registry: &Registry,
    tmp: &Path,
    name: &str,
    text: &str,
    chaos: Option<String>,
    progress: bool,
) -> Result<PathBuf, CliError> {
    let job_path = tmp.join(format!("{name}.toml"));
    std::fs::write(&job_path, text)
        .map_err(CliError::io(format!("writing {}", job_path.display())))?;
    let job = LoadedJob::read(&job_path)?;
    let plan = tandem_rl::config::validate(&job, registry)?;
    let run_dir = tmp.join(format!("run-{name}"));
    let opts = RunOptions {
        run_dir: run_dir.clone(),
        resume: false,
        steps: None,
        progress,
        exe: Some(crate::exe::tandem()?),
        plugin_dirs: Vec::new(),
        chaos,
    };
    if plan.is_drafter_job() {
        tandem_rl::algorithm::drafter::run(&plan, registry, opts)?;
    } else {
        tandem_rl::run(&plan, registry, opts)?;
    }
    Ok(run_dir)
}

/// The metrics lines of a run.
pub(super) fn metrics(run_dir: &Path) -> Vec<StepMetrics> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Seconds of each recovery of a run (its `recovered` events: "<workers> in <s> s").
fn recovery_times(run_dir: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["op"] == "recovered")
        .filter_map(|e| {
            let d = e["detail"].as_str()?;
            d.rsplit(" in ").next()?.trim_end_matches(" s").parse().ok()
        })
        .collect()
}
