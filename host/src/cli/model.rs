//! `tandem model init --preset tiny|small --out DIR [--seed S]`: writes a random-initialised
//! model with a locally trained tokenizer in the Hugging Face layout (native plugin's presets).

use crate::error::HostError;
use clap::Subcommand;
use std::path::{Path, PathBuf};
use tandem_plugin_native::buffer::VecProvider;
use tandem_plugin_native::init::{Preset, init_preset};

/// `tandem model` subcommands.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write a random-initialised preset model + tokenizer into a new directory.
    Init {
        /// Model size: `tiny` (~3 M parameters) or `small` (~24 M).
        #[arg(long)]
        preset: String,
        /// Output directory (must not exist or be empty).
        #[arg(long)]
        out: PathBuf,
        /// Seed of the weight initialisation.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

pub(super) fn run(cmd: ModelCommand) -> Result<(), HostError> {
    match cmd {
        ModelCommand::Init { preset, out, seed } => init(&preset, &out, seed),
    }
}

fn init(preset: &str, out: &Path, seed: u64) -> Result<(), HostError> {
    let preset = Preset::parse(preset).map_err(|e| HostError::Usage(format!("--preset: {e}")))?;
    if let Ok(mut entries) = std::fs::read_dir(out)
        && entries.next().is_some()
    {
        return Err(HostError::Usage(format!(
            "refusing to write a model into {}: the directory is not empty (choose a new --out \
             or empty it)",
            out.display()
        )));
    }
    if out.is_file() {
        return Err(HostError::Usage(format!(
            "--out {} is a file; give a directory path",
            out.display()
        )));
    }
    let model = init_preset(preset, out, seed, &mut VecProvider::new()).map_err(|e| {
        HostError::Runtime(format!("writing the model into {}: {e}", out.display()))
    })?;
    println!(
        "wrote a {:?} model ({} parameters, seed {seed}) to {}",
        preset,
        model.layout.num_params(),
        out.display()
    );
    Ok(())
}
