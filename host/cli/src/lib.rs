//! `tandem-cli`: the `tandem` command line — argument parsing (clap), one module per
//! subcommand, and logging. The binary (`app/`) links it with the built-in plugins and calls
//! [`main`]. `tandem bench` runs the separate `tandem-bench` binary ([`bench`]).

#![forbid(unsafe_code)]

pub mod bench;
mod check;
pub mod error;
mod eval;
mod generate;
mod launch;
mod log;
pub mod logging;
mod model;
mod plugins;
mod run;
mod serve;

use crate::error::CliError;
use crate::logging::LogFormat;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Tandem: run an inference engine and a trainer in tandem for RL post-training.
#[derive(Debug, Parser)]
#[command(name = "tandem", version, about, max_term_width = 100)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "pretty", global = true)]
    pub log_format: LogFormat,
    /// More log output (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Extra plugin directory (repeatable); also `[plugins] dirs` and `TANDEM_PLUGIN_PATH`.
    #[arg(long = "plugin-dir", value_name = "DIR", global = true)]
    pub plugin_dirs: Vec<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every plugin with kind, version, API level, source and capabilities.
    Plugins {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Validate a job file and print the resolved plan.
    Check {
        /// The job file.
        job: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Run a job: the RL loop (`--resume RUN_DIR` continues a run).
    Run(run::RunArgs),
    /// Submit a job to a cluster: `--sbatch` prints the `sbatch` script of a Slurm job.
    Launch(launch::LaunchArgs),
    /// Run a benchmark (the `tandem-bench` binary; `tandem bench --help` lists them); each
    /// figure is printed beside its limit measured in the same run.
    #[command(disable_help_flag = true)]
    Bench(bench::BenchArgs),
    /// Model files: `tandem model init` (preset models), `tandem model sft` (warm starts),
    /// `tandem model merge-lora` (an adapter merged into its base).
    Model {
        /// What to do.
        #[command(subcommand)]
        command: model::ModelCommand,
    },
    /// One-shot generation with the native engine.
    Generate(generate::GenerateArgs),
    /// Serve a model over HTTP: SGLang's native API and OpenAI's /v1 API (native engine).
    Serve(serve::ServeArgs),
    /// Greedy accuracy of a model on a task's held-out set (the run's `[eval]`, reproduced).
    Eval(eval::EvalArgs),
    /// Experiment trackers: `tandem log push RUN_DIR` sends a run's metrics to them.
    Log {
        /// What to do.
        #[command(subcommand)]
        command: log::LogCommand,
    },
    /// Run one worker process (started by `tandem run`'s launcher, not by hand).
    #[command(hide = true)]
    Worker(tandem_runtime::worker::WorkerArgs),
}

/// Parses the process arguments, runs the command, and maps errors to exit codes.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let verbosity = if cli.quiet {
        -1
    } else {
        cli.verbose.min(3) as i8
    };
    logging::init(cli.log_format, verbosity);
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            for line in err.lines() {
                eprintln!("error: {line}");
            }
            ExitCode::from(err.exit_code())
        }
    }
}

fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Plugins { json } => plugins::run(&cli.plugin_dirs, json),
        Command::Check { job, json } => check::run(&cli.plugin_dirs, &job, json),
        Command::Run(args) => run::run(&cli.plugin_dirs, args, cli.quiet),
        Command::Launch(args) => launch::run(&cli.plugin_dirs, args),
        Command::Bench(args) => bench::run(
            &cli.plugin_dirs,
            cli.log_format,
            cli.verbose,
            cli.quiet,
            args,
        ),
        Command::Model { command } => model::run(&cli.plugin_dirs, command),
        Command::Generate(args) => generate::run(&cli.plugin_dirs, args),
        Command::Serve(args) => serve::run(&cli.plugin_dirs, args),
        Command::Eval(args) => eval::run(&cli.plugin_dirs, args),
        Command::Log { command } => log::run(&cli.plugin_dirs, command),
        Command::Worker(args) => tandem_runtime::worker::run(args).map_err(CliError::from),
    }
}

/// Prints a value as one line of JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<(), CliError> {
    let line = serde_json::to_string(value)
        .map_err(|e| CliError::failed(format!("cannot serialise output: {e}")))?;
    println!("{line}");
    Ok(())
}

/// Loads the registry from the CLI's, the job's and the environment's plugin directories.
fn load_registry(
    cli_dirs: &[PathBuf],
    job_dirs: &[PathBuf],
) -> Result<tandem_runtime::registry::Registry, CliError> {
    let dirs = tandem_runtime::registry::plugin_dirs(cli_dirs, job_dirs);
    tandem_runtime::registry::Registry::discover(&dirs)
        .map_err(|e| CliError::Runtime(tandem_runtime::RuntimeError::Plugins(e)))
}
