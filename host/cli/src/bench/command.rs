//! `tandem bench NAME [--json] [--quick] [--across-netns NETNS]`.

use crate::bench::bridges_vllm::VllmRows;
use crate::bench::{self, Figure};
use crate::error::CliError;
use std::path::PathBuf;

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
        BenchName::Abi => bench::abi::run(if quick { 100_000 } else { 10_000_000 }),
        BenchName::Memory => bench::memory::run(quick)?,
        BenchName::Transport => match across_netns {
            Some(ns) => bench::transport_netns::run(ns, quick)?,
            None => bench::transport::run(quick)?,
        },
        BenchName::Control => crate::bench::control::run(quick)?,
        BenchName::Loop => bench::rl_loop::run(quick)?,
        BenchName::Native => bench::native::run(quick)?,
        BenchName::Spec => bench::spec::run(quick)?,
        BenchName::Serve => bench::serve::run(quick)?,
        BenchName::Trainers => bench::trainers::run(plugin_dirs, quick)?,
        BenchName::Soak => bench::soak::run(quick)?,
        BenchName::Bridges => {
            let mut figures = bench::bridges::run(quick)?;
            match bench::bridges_vllm::run(plugin_dirs, &figures)? {
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
            crate::print_json(f)?;
        }
    } else {
        println!("{}", bench::table(&figures));
    }
    Ok(())
}
