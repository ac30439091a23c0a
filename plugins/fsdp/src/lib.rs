//! The `fsdp` trainer plugin (`libtandem_fsdp.so`): runs a torchrun job of PyTorch FSDP2
//! ranks (gloo on CPU, NCCL on GPU) and drives it over a framed JSON channel to rank 0.
//! The Python worker package is embedded in the library and written next to the run.
//! See `plugins/fsdp/NOTES.md` for the operation map, the loss and the measured figures.

#![forbid(unsafe_code)]

pub mod channel;
pub mod options;
pub mod trainer;
pub mod worker;

use tandem_plugin_api::sdk::{self, Plugin, Result, trainer_box};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigProblem, HostBox,
    PluginError, PluginManifest, RString, RVec, TrainerBox, UpdateKind,
};

/// Memory tags the trainer frees on CPU (gradients, set to `None` after a step).
pub const RELEASABLE: [&str; 1] = ["grads"];

pub use options::FsdpOptions;
pub use trainer::FsdpTrainer;

/// The `fsdp` plugin.
pub struct FsdpPlugin;

fn strs(v: &[&str]) -> RVec<RString> {
    v.iter().map(|s| RString::from(*s)).collect()
}

impl Plugin for FsdpPlugin {
    fn manifest() -> PluginManifest {
        let trainer = ComponentDecl {
            kind: ComponentKind::Trainer,
            name: "fsdp".into(),
            description: "PyTorch FSDP2 (fully_shard) over torchrun ranks: HF model, GRPO/SFT \
                          steps, actor/ref snapshots, gathered HF checkpoints, PEFT LoRA adapters"
                .into(),
            caps: Capabilities {
                update_kinds: vec![UpdateKind::CheckpointDir, UpdateKind::Adapter].into(),
                // Gradients are freed after every step; on CPU the parameters and optimizer
                // state already live in host memory, so offloading them frees nothing.
                releasable_tags: strs(&RELEASABLE),
                pause_modes: RVec::new(),
                hidden_states: false,
                lora: true,
                needs_gpu: strs(&[
                    "NCCL process group (device = cuda): ranks on GPUs",
                    "offload/onload moves parameters and optimizer state between GPU and host memory",
                ]),
                notes: strs(&[
                    "needs Python with torch, transformers, peft: the python option, else $TANDEM_PYTHON, else the venv scripts/setup-python.sh records (bash scripts/setup.sh)",
                    "options.ranks = FSDP ranks under torchrun (gloo on CPU)",
                    "exports carry no weight digest: use [bridge] verify = false",
                    "checkpoint_dir exports with full fine-tuning, adapter exports with options.lora",
                ]),
            },
        };
        sdk::manifest("fsdp", env!("CARGO_PKG_VERSION"), vec![trainer])
    }

    fn new_trainer(config: ComponentConfig, host: HostBox) -> Result<TrainerBox> {
        if config.component.as_str() != "fsdp" {
            return Err(PluginError::invalid_input(format!(
                "plugin `fsdp` has no trainer `{}`",
                config.component
            )));
        }
        Ok(trainer_box(FsdpTrainer::new(config, host)?))
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if kind != ComponentKind::Trainer || config.component.as_str() != "fsdp" {
            return vec![ConfigProblem::new(
                "",
                format!(
                    "plugin `fsdp` has no {} `{}`",
                    kind.as_str(),
                    config.component
                ),
            )];
        }
        // The options, then the Python environment torchrun would start (what `init`
        // resolves): a missing venv is refused before anything starts.
        let problems = FsdpOptions::problems_of(&config.options_json);
        if !problems.is_empty() {
            return problems;
        }
        match FsdpOptions::parse(&config.options_json).and_then(|o| o.interpreter()) {
            Err(e) => {
                let message = e.message.as_str();
                let message = message.strip_prefix("trainer `fsdp`: ").unwrap_or(message);
                vec![ConfigProblem::new("python", message).with_help(e.help)]
            }
            // A bare name is looked up on PATH at spawn; a path must exist.
            Ok(python) if python.path.components().count() > 1 && !python.path.is_file() => vec![
                ConfigProblem::new(
                    "python",
                    format!(
                        "Python {} (from {}) does not exist",
                        python.path.display(),
                        python.source
                    ),
                )
                .with_help(tandem_plugin_support::python::SETUP_HELP),
            ],
            Ok(_) => Vec::new(),
        }
    }
}

tandem_plugin_api::export_plugin!(FsdpPlugin);
