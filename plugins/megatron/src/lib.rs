//! The `megatron` trainer plugin (`libtandem_megatron.so`): runs a torchrun job of
//! Megatron-Core ranks — tensor parallel `tp` × data parallel `dp`, gloo on CPU, NCCL on GPU —
//! and drives it over the framed JSON channel of `tandem_plugin_support::torchrun`. The
//! Python worker package (Megatron `GPTModel`, an HF ↔ Megatron converter, the CPU patches)
//! is embedded in the library and written next to the run. See `plugins/megatron/NOTES.md`.

#![forbid(unsafe_code)]

/// The plugin contract (`tandem-conformance`) against this plugin's built library.
#[cfg(test)]
mod conformance_tests;
pub mod model;
pub mod options;

use std::path::{Path, PathBuf};

use tandem_plugin_api::sdk::{self, Plugin, Result, trainer_box};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, ConfigCaps, ConfigProblem,
    HostBox, PluginError, PluginManifest, RString, RVec, TrainerBox, UpdateKind,
};
use tandem_plugin_support::torchrun::{Job, Launch, PackageFile, TorchrunTrainer};

pub use options::MegatronOptions;

/// Memory tags the trainer frees on CPU (gradients, set to `None` after a step).
pub const RELEASABLE: [&str; 1] = ["grads"];

/// The Python worker package, embedded so the plugin library is self-contained.
const PACKAGE: [PackageFile; 7] = [
    (
        "__init__.py",
        include_str!("../python/tandem_megatron_worker/__init__.py"),
    ),
    (
        "__main__.py",
        include_str!("../python/tandem_megatron_worker/__main__.py"),
    ),
    (
        "checkpoint.py",
        include_str!("../python/tandem_megatron_worker/checkpoint.py"),
    ),
    (
        "convert.py",
        include_str!("../python/tandem_megatron_worker/convert.py"),
    ),
    (
        "cpu_patch.py",
        include_str!("../python/tandem_megatron_worker/cpu_patch.py"),
    ),
    (
        "stream.py",
        include_str!("../python/tandem_megatron_worker/stream.py"),
    ),
    (
        "trainer.py",
        include_str!("../python/tandem_megatron_worker/trainer.py"),
    ),
];

/// The torchrun job of the `megatron` trainer.
pub static JOB: Job = Job {
    component: "megatron",
    package: ("tandem_megatron_worker", &PACKAGE),
    needs: &["torch", "transformers", "megatron.core", "safetensors"],
    exports: &[UpdateKind::CheckpointDir],
    releasable: &RELEASABLE,
    releasable_help: "trainer `megatron` releases only its gradients on CPU (declared releasable_tags)",
};

/// The `megatron` trainer: the torchrun trainer of [`JOB`] with the job file's options.
pub fn trainer(config: &ComponentConfig) -> Result<TorchrunTrainer> {
    let o = MegatronOptions::parse(config.options_json.as_str())?;
    let model = PathBuf::from(config.model_path.as_str());
    if let Some(p) = model::problems(&model, o.own.tp).first() {
        return Err(p.to_error(options::WHAT));
    }
    let launch = Launch {
        model,
        run_dir: config.run_dir.to_string(),
        device: config.device.to_string(),
        python: o.common.interpreter(options::WHAT)?,
        ranks: o.ranks(),
        threads: o.common.threads_per_rank(o.ranks()),
        options: o.worker_json(),
        startup_timeout_s: o.common.startup_timeout_s,
        call_timeout_s: o.common.call_timeout_s,
        collective_timeout_s: o.common.collective_timeout_s,
    };
    let extra = vec![
        ("tp".into(), f64::from(o.own.tp)),
        ("dp".into(), f64::from(o.own.dp)),
    ];
    TorchrunTrainer::new(&JOB, launch, extra)
}

/// The `megatron` plugin.
pub struct MegatronPlugin;

fn strs(v: &[&str]) -> RVec<RString> {
    v.iter().map(|s| RString::from(*s)).collect()
}

impl Plugin for MegatronPlugin {
    fn manifest() -> PluginManifest {
        let trainer = ComponentDecl {
            kind: ComponentKind::Trainer,
            name: "megatron".into(),
            description: "Megatron-Core GPTModel over torchrun ranks, tensor × data parallel: HF \
                          Llama/Qwen2 weights converted into TP shards and back, GRPO/SFT steps, \
                          actor/ref snapshots, gathered HF checkpoints"
                .into(),
            caps: Capabilities {
                update_kinds: vec![UpdateKind::CheckpointDir].into(),
                // Gradients are freed after every step; on CPU the parameters and optimizer
                // state already live in host memory, so offloading them frees nothing.
                releasable_tags: strs(&RELEASABLE),
                pause_modes: RVec::new(),
                hidden_states: false,
                lora: false,
                needs_gpu: strs(&[
                    "NCCL process groups (device = cuda): ranks on GPUs, no CPU patches",
                    "offload/onload moves parameters and optimizer state between GPU and host memory",
                ]),
                notes: strs(&[
                    "needs Python with torch, transformers, megatron-core 0.16.1, safetensors: the python option, else $TANDEM_PYTHON, else the venv scripts/setup-python.sh records (bash scripts/setup.sh)",
                    "options.tp × options.dp ranks under torchrun (gloo on CPU); heads, KV heads, FFN width and vocabulary must divide by tp",
                    "LlamaForCausalLM and Qwen2ForCausalLM checkpoints (HF safetensors in, HF safetensors out)",
                    "exports checkpoint_dir updates, each with the st256 digest of the tensors it wrote (options.digest = false: none); no LoRA",
                ]),
            },
        };
        sdk::manifest("megatron", env!("CARGO_PKG_VERSION"), vec![trainer])
    }

    fn new_trainer(config: ComponentConfig, _host: HostBox) -> Result<TrainerBox> {
        if config.component.as_str() != "megatron" {
            return Err(PluginError::invalid_input(format!(
                "plugin `megatron` has no trainer `{}`",
                config.component
            )));
        }
        Ok(trainer_box(trainer(&config)?))
    }

    fn describe_config(kind: ComponentKind, config: &ComponentConfig) -> Option<ConfigCaps> {
        (kind == ComponentKind::Trainer && config.component.as_str() == "megatron")
            .then(|| describe(&config.options_json))
            .flatten()
    }

    fn validate_config(kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if kind != ComponentKind::Trainer || config.component.as_str() != "megatron" {
            return vec![ConfigProblem::new(
                "",
                format!(
                    "plugin `megatron` has no {} `{}`",
                    kind.as_str(),
                    config.component
                ),
            )];
        }
        // The options, the model against the layout, then the Python environment torchrun
        // would start: each refused before anything starts.
        let problems = MegatronOptions::problems_of(&config.options_json);
        if !problems.is_empty() {
            return problems;
        }
        match MegatronOptions::parse(&config.options_json) {
            Ok(o) => {
                let model = model::problems(Path::new(config.model_path.as_str()), o.own.tp);
                if !model.is_empty() {
                    return model;
                }
                o.common.python_problems(options::WHAT)
            }
            Err(e) => vec![ConfigProblem::new("", e.message.as_str())],
        }
    }
}

/// What the `megatron` trainer does with `options_json`; `None` when they do not parse
/// (`validate_config` says why).
pub fn describe(options_json: &str) -> Option<ConfigCaps> {
    let o = MegatronOptions::parse(options_json).ok()?;
    Some(ConfigCaps {
        update_kinds: vec![UpdateKind::CheckpointDir].into(),
        // The worker refuses a longer sequence; RoPE's table has this length.
        max_seq_len: o.own.seq_length,
        // Every variant of tandem_torchrun/loss.py (train_step_policy).
        loss_variants: true,
        reports_digest: o.common.digest,
        ..ConfigCaps::default()
    })
}

tandem_plugin_api::export_plugin!(MegatronPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_says_its_sequence_length_and_checkpoint_exports() {
        let c = describe(r#"{"seq_length": 256}"#).expect("parses");
        assert_eq!(c.max_seq_len, 256);
        assert_eq!(c.update_kinds.as_slice(), &[UpdateKind::CheckpointDir]);
        assert!(c.loss_variants && c.reports_digest);
        assert!(
            !describe(r#"{"digest": false}"#)
                .expect("parses")
                .reports_digest
        );
        assert_eq!(describe("{}").expect("defaults").max_seq_len, 1024);
        assert!(describe(r#"{"tp": 0}"#).is_none());
    }
}
