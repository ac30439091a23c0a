//! `tandem bench NAME [--json] [--quick] [--across-netns NETNS]`: the `tandem-bench` command
//! line ([`main`]), which `tandem bench` runs with its own arguments, and [`run`], one bench.

use crate::Figure;
use crate::bridges_vllm::VllmRows;
use crate::transport_netns::{PEER_COMMAND, PeerArgs};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem_cli::error::CliError;
use tandem_cli::logging::{self, LogFormat};

/// Run a benchmark; each figure is printed beside its limit measured in the same run.
#[derive(Debug, Parser)]
#[command(
    name = "tandem-bench",
    bin_name = "tandem bench",
    version,
    max_term_width = 100,
    args_override_self = true
)]
pub struct BenchCli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "pretty")]
    pub log_format: LogFormat,
    /// More log output (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long)]
    pub quiet: bool,
    /// Extra plugin directory (repeatable); also `TANDEM_PLUGIN_PATH`.
    #[arg(long = "plugin-dir", value_name = "DIR")]
    pub plugin_dirs: Vec<PathBuf>,
    /// Which benchmark.
    #[arg(value_enum)]
    pub name: BenchName,
    /// One JSON object per figure.
    #[arg(long)]
    pub json: bool,
    /// Smaller sizes and fewer repetitions.
    #[arg(long)]
    pub quick: bool,
    /// `transport` only: tcp between this process and a peer in the network namespace
    /// NETNS (e.g. `tnd-n2`, from `scripts/cluster/netns-up.sh`; needs root), beside a
    /// plain socket copy over the same path, instead of the loopback figures.
    #[arg(long, value_name = "NETNS")]
    pub across_netns: Option<String>,
}

/// The peer of `tandem bench transport --across-netns` (started by the bench, not by hand).
#[derive(Debug, Parser)]
#[command(name = PEER_COMMAND)]
struct PeerCli {
    #[command(flatten)]
    args: PeerArgs,
}

/// Parses the process arguments (a bench, or the hidden [`PEER_COMMAND`]), runs it, and maps
/// errors to exit codes as `tandem` does: one `error:` line each, 2 for user errors, 1 for
/// runtime failures.
pub fn main() -> ExitCode {
    let peer = std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == PEER_COMMAND);
    let result = if peer {
        let cli = PeerCli::parse_from(std::env::args_os().skip(1));
        crate::transport_netns::peer(cli.args)
    } else {
        let cli = BenchCli::parse();
        let verbosity = if cli.quiet {
            -1
        } else {
            cli.verbose.min(3) as i8
        };
        logging::init(cli.log_format, verbosity);
        run(
            &cli.plugin_dirs,
            cli.name,
            cli.json,
            cli.quick,
            cli.across_netns.as_deref(),
        )
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            for line in err.lines() {
                eprintln!("error: {line}");
            }
            ExitCode::from(err.exit_code())
        }
    }
}

/// Available benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchName {
    /// Engine-trait call across the plugin ABI vs a direct `dyn` call.
    Abi,
    /// Memory-layer pause/resume beside memcpy and the kernel's page rates.
    Memory,
    /// Transport point-to-point/broadcast bandwidth and latency beside memcpy.
    Transport,
    /// Control-plane call round trip and bulk replies beside raw TCP loopback.
    Control,
    /// A short GRPO run: orchestration overhead and phase times beside the step time.
    Loop,
    /// Asynchronous RL: one job synchronous and with `max_staleness` 1, 2 (`tis`) and 4 (no
    /// correction), engine and trainer on cores 0 and 1: samples/s beside the synchronous
    /// run's, each role's idle share, the staleness of the trained samples, held-out accuracy
    /// at equal sample counts; `--quick`: 8 steps a run instead of 40.
    Async,
    /// Weight-bridge sync latency, bytes moved and peak memory per mode and model size; with
    /// `$TANDEM_PYTHON` and the `vllm` plugin (`--plugin-dir`), vLLM rows beside the native ones.
    Bridges,
    /// The native engine's decode tok/s (batch 1/8/64) and the native trainer's GRPO step
    /// (full and LoRA) on SmolLM2-135M, beside vLLM's decode and torch's step on the same model
    /// in the same run (`$TANDEM_PYTHON`), else the machine bounds; `--quick`: the tiny preset.
    Native,
    /// Speculative decoding: a drafter trained in the run on each model's own greedy
    /// continuations, decode tok/s with and without it (batch 1/4/16) beside the acceptance
    /// length, and hidden-state transfer between two workers beside memcpy; `--quick`: tiny.
    Spec,
    /// `tandem serve` over HTTP at 1/8/64 concurrent clients: requests/s and tokens/s beside
    /// the same requests through the engine in process (batches of the client count).
    Serve,
    /// One GRPO step on the same batch through the native, `fsdp` (1/2 ranks) and `megatron`
    /// (TP=1/2) trainers on the tiny and small presets, each beside its peer of the same run
    /// (`$TANDEM_PYTHON` and the plugins via `--plugin-dir`); `--quick`: tiny only.
    Trainers,
    /// `examples/drafter.toml` for 1000 steps (`--quick`: 100): the memory ledger's drift and
    /// the workers' allocated memory growth beside their early values, and the drafter's
    /// acceptance length beside `draft_tokens + 1`.
    Soak,
    /// Environment scoring through `dataset`: a bare Python reward per sample beside the same
    /// call inside Python; a 3 ms Python reward over 512 samples with 1/2/4 workers (seconds
    /// per step, samples/s) beside the ideal; the built-in `math` verifier per sample;
    /// `$TANDEM_PYTHON`; `--quick`: 64 samples.
    Env,
}

/// Runs one benchmark and prints its table (or one JSON line per figure with `json`);
/// `across_netns` (transport only) measures tcp to a peer in that network namespace instead.
pub fn run(
    plugin_dirs: &[PathBuf],
    name: BenchName,
    json: bool,
    quick: bool,
    across_netns: Option<&str>,
) -> Result<(), CliError> {
    if let Some(ns) = across_netns
        && name != BenchName::Transport
    {
        return Err(CliError::usage(format!(
            "--across-netns {ns} applies to `tandem bench transport` only"
        )));
    }
    let figures: Vec<Figure> = match name {
        BenchName::Abi => crate::abi::run(if quick { 100_000 } else { 10_000_000 }),
        BenchName::Memory => crate::memory::run(quick)?,
        BenchName::Transport => match across_netns {
            Some(ns) => crate::transport_netns::run(ns, quick)?,
            None => crate::transport::run(quick)?,
        },
        BenchName::Control => crate::control::run(quick)?,
        BenchName::Loop => crate::rl_loop::run(quick)?,
        BenchName::Async => crate::rl_async::run(quick)?,
        BenchName::Native => crate::native::run(quick)?,
        BenchName::Spec => crate::spec::run(quick)?,
        BenchName::Serve => crate::serve::run(quick)?,
        BenchName::Trainers => crate::trainers::run(plugin_dirs, quick)?,
        BenchName::Soak => crate::soak::run(quick)?,
        BenchName::Env => crate::envs::run(quick)?,
        BenchName::Bridges => {
            let mut figures = crate::bridges::run(quick)?;
            match crate::bridges_vllm::run(plugin_dirs, &figures)? {
                VllmRows::Figures(v) => figures.extend(v),
                VllmRows::Skipped(why) => {
                    let why = tandem_runtime::error::render(&why.text, why.help.as_deref());
                    eprintln!("tandem bench bridges: vLLM rows skipped: {why}");
                }
            }
            figures
        }
    };
    if json {
        for f in &figures {
            tandem_cli::print_json(f)?;
        }
    } else {
        println!("{}", crate::table(&figures));
    }
    Ok(())
}
