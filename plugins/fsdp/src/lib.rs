//! The `fsdp` trainer plugin (`libtandem_fsdp.so`): runs a torchrun job of PyTorch FSDP2
//! ranks (gloo on CPU, NCCL on GPU) and drives it over a framed JSON channel to rank 0.
//! The Python worker package is embedded in the library and written next to the run.
//! See `plugins/fsdp/NOTES.md` for the operation map, the loss and the measured figures.

#![forbid(unsafe_code)]

/// The plugin contract (`tandem-conformance`) against this plugin's built library.
#[cfg(test)]
mod conformance_tests;
pub mod options;

use std::path::PathBuf;

use serde_json::Value;
use tandem_plugin_api::sdk::{self, Plugin, Result, trainer_box};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps, ConfigProblem,
    HostBox, PluginError, PluginManifest, RString, RVec, TrainerBox, UpdateKind,
};
use tandem_plugin_support::torchrun::{Job, Launch, PackageFile, TorchrunTrainer};

pub use options::FsdpOptions;

/// Memory tags the trainer frees on CPU (gradients, set to `None` after a step).
pub const RELEASABLE: [&str; 1] = ["grads"];

/// The Python worker package, embedded so the plugin library is self-contained.
const PACKAGE: [PackageFile; 3] = [
    (
        "__init__.py",
        include_str!("../python/tandem_fsdp_worker/__init__.py"),
    ),
    (
        "__main__.py",
        include_str!("../python/tandem_fsdp_worker/__main__.py"),
    ),
    (
        "trainer.py",
        include_str!("../python/tandem_fsdp_worker/trainer.py"),
    ),
];

/// The torchrun job of the `fsdp` trainer.
pub static JOB: Job = Job {
    component: "fsdp",
    package: ("tandem_fsdp_worker", &PACKAGE),
    needs: &["torch", "transformers", "peft", "safetensors"],
    exports: &[UpdateKind::CheckpointDir, UpdateKind::Adapter],
    releasable: &RELEASABLE,
    releasable_help: "trainer `fsdp` releases only its gradients on CPU (declared releasable_tags)",
};

/// The `fsdp` trainer: the torchrun trainer of [`JOB`] with the job file's options.
pub fn trainer(config: &ComponentConfig) -> Result<TorchrunTrainer> {
    let o = FsdpOptions::parse(config.options_json.as_str())?;
    let mut worker_options = o.common.worker_json();
    let lora = serde_json::to_value(&o.own.lora).unwrap_or(Value::Null);
    worker_options.insert("lora".into(), lora);
    let launch = Launch {
        model: PathBuf::from(config.model_path.as_str()),
        run_dir: config.run_dir.to_string(),
        device: config.device.to_string(),
        python: o.common.interpreter(options::WHAT)?,
        ranks: o.own.ranks,
        threads: o.common.threads_per_rank(o.own.ranks),
        options: Value::Object(worker_options),
        startup_timeout_s: o.common.startup_timeout_s,
        call_timeout_s: o.common.call_timeout_s,
        collective_timeout_s: o.common.collective_timeout_s,
    };
    let lora = if o.own.lora.is_some() { 1.0 } else { 0.0 };
    TorchrunTrainer::new(&JOB, launch, vec![("lora".into(), lora)])
}

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
                    "every export carries the st256 digest of the tensors it wrote (options.digest = false: none)",
                    "checkpoint_dir exports with full fine-tuning, adapter exports with options.lora",
                ]),
            },
        };
        sdk::manifest("fsdp", env!("CARGO_PKG_VERSION"), vec![trainer])
    }

    fn new_trainer(config: ComponentConfig, _host: HostBox) -> Result<TrainerBox> {
        if config.component.as_str() != "fsdp" {
            return Err(PluginError::invalid_input(format!(
                "plugin `fsdp` has no trainer `{}`",
                config.component
            )));
        }
        Ok(trainer_box(trainer(&config)?))
    }

    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        (kind == ComponentKind::Trainer && config.component.as_str() == "fsdp")
            .then(|| describe(&config.options_json))
            .flatten()
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
        match FsdpOptions::parse(&config.options_json) {
            Ok(o) => o.common.python_problems(options::WHAT),
            Err(e) => vec![ConfigProblem::new("", e.message.as_str())],
        }
    }
}

/// What the `fsdp` trainer does with `options_json`; `None` when they do not parse
/// (`validate_config` says why).
pub fn describe(options_json: &str) -> Option<ConfigCaps> {
    let o = FsdpOptions::parse(options_json).ok()?;
    // The worker's export: the adapter with LoRA, the whole checkpoint without, never both.
    let kind = if o.own.lora.is_some() {
        UpdateKind::Adapter
    } else {
        UpdateKind::CheckpointDir
    };
    Some(ConfigCaps {
        update_kinds: vec![kind].into(),
        // Every variant of tandem_torchrun/loss.py (train_step_policy).
        loss_variants: true,
        reports_digest: o.common.digest,
        ..ConfigCaps::default()
    })
}

tandem_plugin_api::export_plugin!(FsdpPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lora_trainer_exports_its_adapter_only_and_a_full_one_its_checkpoint() {
        let lora = describe(r#"{"lora": {"rank": 4, "alpha": 8}}"#).expect("parses");
        assert_eq!(lora.update_kinds.as_slice(), &[UpdateKind::Adapter]);
        let full = describe("{}").expect("parses");
        assert_eq!(full.update_kinds.as_slice(), &[UpdateKind::CheckpointDir]);
        assert!(full.loss_variants && full.reports_digest && !full.value_model);
        let off = describe(r#"{"digest": false}"#).expect("parses");
        assert!(!off.reports_digest);
        assert!(describe(r#"{"ranks": "two"}"#).is_none());
    }
}
