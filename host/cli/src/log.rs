//! `tandem log push RUN_DIR`: sends a run's `metrics.jsonl` to its trackers (the job's
//! `[logging]`, and those the flags add) from where each left off, and ends their runs — for a
//! tracker that was down at the end of a run, or to replay a finished run into another.

use crate::error::CliError;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tandem_rl::config::Overrides;
use tandem_track::{MlflowPlan, TrackPlan, WandbMode, WandbPlan, WandbSection};

/// `tandem log ...`.
#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// Send a run's metrics to its trackers (and those the flags name) from where each left
    /// off; exits non-zero while a tracker still lacks steps.
    Push(PushArgs),
}

/// `tandem log push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Also write TensorBoard event files (in RUN_DIR/tensorboard).
    #[arg(long)]
    pub tensorboard: bool,
    /// Also (or instead of the job's) log to this W&B project.
    #[arg(long)]
    pub wandb_project: Option<String>,
    /// W&B mode for --wandb-project: online or offline.
    #[arg(long, default_value = "online", requires = "wandb_project")]
    pub wandb_mode: String,
    /// Also (or instead of the job's) log to this MLflow server.
    #[arg(long)]
    pub mlflow_uri: Option<String>,
    /// MLflow experiment for --mlflow-uri (default: the job's, else "tandem").
    #[arg(long, requires = "mlflow_uri")]
    pub mlflow_experiment: Option<String>,
}

pub(super) fn run(cli_dirs: &[PathBuf], command: LogCommand) -> Result<(), CliError> {
    let LogCommand::Push(args) = command;
    let job_path = tandem_rl::driver::job_of_run(&args.run_dir)?;
    let overrides = Overrides {
        output_dir: Some(args.run_dir.clone()),
    };
    let plan = super::check::resolve(cli_dirs, &job_path, &overrides)?.plan;
    let tracking = with_flags(plan.tracking.clone(), &args)?;
    if tracking.is_empty() {
        return Err(CliError::usage(format!(
            "{}: the job has no trackers in [logging] and no flag names one",
            args.run_dir.display()
        ))
        .with_help("add --tensorboard, --wandb-project P or --mlflow-uri URI"));
    }
    let checkpoint = tandem_rl::checkpoint::newest_valid(&args.run_dir)
        .ok()
        .flatten()
        .map(|r| r.dir);
    let run = tandem_track::RunInfo {
        run_dir: args.run_dir.clone(),
        name: plan.name.clone(),
        config: serde_json::to_value(&plan).unwrap_or_default(),
        job_text: plan.job.text.clone(),
        restart_at: None,
    };
    let report = tandem_track::push(&tracking, run, checkpoint.as_deref())
        .map_err(|e| CliError::failed(format!("tandem log push: {e}")))?;
    for w in &report.warnings {
        eprintln!("{w}");
    }
    for (name, n) in &report.sent {
        println!("{name}: sent {n} steps");
    }
    if let Some((name, n)) = report.pending.first() {
        return Err(CliError::failed(format!(
            "{name} still lacks {n} steps of {}",
            args.run_dir.display()
        ))
        .with_help("bring the tracker back and run `tandem log push` again"));
    }
    Ok(())
}

/// The run's trackers with those the flags name (a flag replaces the job's tracker of its
/// kind).
fn with_flags(mut plan: TrackPlan, args: &PushArgs) -> Result<TrackPlan, CliError> {
    if args.tensorboard && plan.tensorboard.is_none() {
        plan.tensorboard = Some(args.run_dir.join("tensorboard"));
    }
    if let Some(project) = &args.wandb_project {
        let mode = match args.wandb_mode.as_str() {
            "online" => WandbMode::Online,
            "offline" => WandbMode::Offline,
            other => {
                return Err(
                    CliError::usage(format!("--wandb-mode {other}: not a W&B mode"))
                        .with_help("use online or offline"),
                );
            }
        };
        let python = plan
            .wandb
            .as_ref()
            .map_or_else(|| tandem_track::track_python(None), |w| w.python.clone());
        plan.wandb = Some(WandbPlan {
            section: WandbSection {
                project: project.clone(),
                mode,
                ..WandbSection::default()
            },
            python,
        });
    }
    if let Some(uri) = &args.mlflow_uri {
        let experiment = args
            .mlflow_experiment
            .clone()
            .or_else(|| plan.mlflow.as_ref().map(|m| m.experiment.clone()))
            .unwrap_or_else(|| "tandem".to_string());
        plan.mlflow = Some(MlflowPlan {
            tracking_uri: uri.trim_end_matches('/').to_string(),
            experiment,
        });
    }
    Ok(plan)
}
