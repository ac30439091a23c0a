//! `tandem run JOB.toml` / `tandem run --resume RUN_DIR`: validate, prepare the run
//! directory, and run the RL loop ([`crate::rl`]).

use super::check::{Resolved, job_dirs};
use crate::error::CliError;
use std::path::PathBuf;
use tandem_rl::config::Overrides;
use tandem_rl::{self, RunOptions};

/// Arguments of `tandem run`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "A worker that dies during a step is restarted and the step goes on \
    (`[run] max_restarts`, `max_restarts_per_run`, `restart_backoff_secs`). To test that, \
    TANDEM_CHAOS=\"seed=S,every=N[,victim=engine|trainer][,at=rollout|offload|train|save|sync]\" \
    SIGKILLs one worker every N steps at a point drawn from the seed."
)]
pub struct RunArgs {
    /// The job file (optional with --resume: the run directory remembers it).
    #[arg(required_unless_present = "resume")]
    pub job: Option<PathBuf>,
    /// Override the job file's run directory.
    #[arg(long, conflicts_with = "resume")]
    pub output_dir: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its newest complete checkpoint.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,
    /// Override the job file's number of steps.
    #[arg(long)]
    pub steps: Option<u32>,
    /// Print the resolved plan as JSON and a JSON summary at the end.
    #[arg(long)]
    pub json: bool,
}

/// An evaluation of the summary as JSON.
fn eval_json((step, accuracy): (u32, f64)) -> serde_json::Value {
    serde_json::json!({"step": step, "accuracy": accuracy})
}

pub(super) fn run(cli_dirs: &[PathBuf], args: RunArgs, quiet: bool) -> Result<(), CliError> {
    let job_path = match (&args.job, &args.resume) {
        (Some(j), _) => j.clone(),
        (None, Some(run_dir)) => tandem_rl::driver::job_of_run(run_dir)?,
        (None, None) => {
            return Err(CliError::usage("give a job file or --resume RUN_DIR"));
        }
    };
    // The same validation as `tandem check`, before anything is created; its registry is the
    // only one this process loads.
    let overrides = Overrides {
        output_dir: args.resume.clone().or(args.output_dir),
    };
    let Resolved {
        job,
        plan,
        registry,
    } = super::check::resolve(cli_dirs, &job_path, &overrides)?;
    let run_dir = plan.output_dir.clone();
    if args.json {
        super::print_json(&plan)?;
    } else if !quiet {
        eprint!("{plan}");
    }
    let opts = RunOptions {
        run_dir: run_dir.clone(),
        resume: args.resume.is_some(),
        steps: args.steps,
        progress: !quiet && !args.json,
        exe: None,
        plugin_dirs: tandem_runtime::registry::plugin_dirs(cli_dirs, &job_dirs(&job)),
        chaos: std::env::var(tandem_rl::driver::CHAOS_ENV).ok(),
    };
    if plan.is_drafter_job() {
        return drafter(&plan, &registry, opts, args.json, quiet);
    }
    let summary = tandem_rl::run(&plan, &registry, opts)?;
    let files = tandem_rl::driver::RunFiles::of(&run_dir);
    if args.json {
        let v = serde_json::json!({
            "last_step": summary.last_step,
            "first_reward": summary.first_reward,
            "final_reward": summary.final_reward,
            "first_eval": summary.first_eval.map(eval_json),
            "last_eval": summary.last_eval.map(eval_json),
            "run_dir": run_dir,
            "metrics": files.metrics,
            "plot": files.plot,
            "checkpoint": summary.checkpoint,
        });
        super::print_json(&v)?;
    } else if !quiet {
        println!(
            "done: {} steps, mean reward {:.3} at the start -> {:.3} over the last steps",
            summary.last_step, summary.first_reward, summary.final_reward
        );
        if let (Some((s0, a0)), Some((s1, a1))) = (summary.first_eval, summary.last_eval) {
            println!(
                "  held-out accuracy {:.1}% at step {s0} -> {:.1}% at step {s1}",
                a0 * 100.0,
                a1 * 100.0
            );
        }
        println!("  metrics    {}", files.metrics.display());
        println!("  plot       {}", files.plot.display());
        println!("  events     {}", files.events.display());
        if let Some(c) = &summary.checkpoint {
            println!("  checkpoint {}", c.display());
        }
    }
    Ok(())
}

/// A drafter-training job (`[algorithm] name = "drafter"`) and its summary.
fn drafter(
    plan: &tandem_rl::config::RunPlan,
    registry: &tandem_runtime::registry::Registry,
    opts: RunOptions,
    json: bool,
    quiet: bool,
) -> Result<(), CliError> {
    let run_dir = opts.run_dir.clone();
    let s = tandem_rl::algorithm::drafter::run(plan, registry, opts)?;
    let files = tandem_rl::driver::RunFiles::of(&run_dir);
    let acceptance = |a: Option<(u32, f64)>| {
        a.map(|(step, len)| serde_json::json!({"step": step, "acceptance_length": len}))
    };
    if json {
        let v = serde_json::json!({
            "last_step": s.last_step,
            "first_loss": s.first_loss,
            "final_loss": s.final_loss,
            "first_acceptance": acceptance(s.first_acceptance),
            "last_acceptance": acceptance(s.last_acceptance),
            "run_dir": run_dir,
            "metrics": files.metrics,
            "plot": files.plot,
            "checkpoint": s.checkpoint,
        });
        super::print_json(&v)?;
    } else if !quiet {
        println!(
            "done: {} steps, drafter loss {:.3} at the start -> {:.3} over the last steps",
            s.last_step, s.first_loss, s.final_loss
        );
        if let Some((step, len)) = s.last_acceptance {
            println!("  mean acceptance length {len:.2} tokens per verification at step {step}");
        }
        println!("  metrics    {}", files.metrics.display());
        println!("  plot       {}", files.plot.display());
        println!("  events     {}", files.events.display());
        if let Some(c) = &s.checkpoint {
            println!("  drafter    {}", c.display());
        }
    }
    Ok(())
}
