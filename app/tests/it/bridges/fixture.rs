//! Fixtures and helpers of the `bridges` tests: models, worker rigs, probes.

#![allow(dead_code, clippy::unwrap_used)]

use crate::common::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tandem_control::Role;
use tandem_plugin_api::{
    GenerateRequest, LossKind, PauseMode, RVec, SamplingParams, TrainBatch, UpdateKind,
    UpdatePayload, WeightUpdate, WhichWeights,
};
use tandem_rl::driver::world::World;
use tandem_runtime::launch::{LaunchOptions, LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_runtime::worker::WorkerSpec;

/// A model written once by `tandem model init` (per preset and seed).
pub(crate) fn model(preset: &str, seed: u64) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let root = DIR.get_or_init(|| process_scratch("bridges-models"));
    let out = root.join(format!("{preset}-{seed}"));
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if !out.join("config.json").exists() {
        init_model(preset, seed, &out);
    }
    out
}

pub(crate) fn spec(role: Role, model: &Path, options: &str, run_dir: &Path) -> WorkerSpec {
    WorkerSpec::single_cpu(role, "native", model, options, run_dir, vec![])
}

pub(crate) struct Rig {
    /// The workers' transport world (bridges that move data over the transport).
    pub(crate) _world: Option<World>,
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) run_dir: PathBuf,
    pub(crate) launcher: LocalLauncher,
    pub(crate) trainer: RemoteTrainer,
    pub(crate) engines: Vec<RemoteEngine>,
}

pub(crate) fn rig(trainer_model: &Path, engine_model: &Path, trainer_options: &str) -> Rig {
    rig_n(trainer_model, engine_model, trainer_options, 1, None, &[])
}

/// A trainer and `engines` engine workers; with `transport_timeout` (s), in a transport world
/// with the group `bridge` (trainer first, then the engines), as a run whose bridge moves data
/// over the transport launches them.
pub(crate) fn rig_n(
    trainer_model: &Path,
    engine_model: &Path,
    trainer_options: &str,
    engines: u32,
    transport_timeout: Option<f64>,
    plugin_dirs: &[PathBuf],
) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().to_path_buf();
    let mut opts = LaunchOptions::new(&run_dir);
    opts.exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_tandem")));
    let mut launcher = LocalLauncher::new(opts).unwrap();
    let world = transport_timeout.map(|t| World::for_bridge(&launcher, engines, "shm", t).unwrap());
    let engine_opts = r#"{"max_batch": 2, "max_seq_len": 64}"#;
    let specs: Vec<WorkerSpec> = (0..engines)
        .map(|i| {
            let mut s = spec(Role::Engine, engine_model, engine_opts, &run_dir);
            s.rank = i;
            s.world_size = engines;
            s.transport = world.as_ref().map(|w| w.spec(1 + i));
            s.plugin_dirs = plugin_dirs.to_vec();
            s
        })
        .collect();
    let engines = launcher.spawn_engines(&specs).unwrap();
    let mut trainer_spec = spec(Role::Trainer, trainer_model, trainer_options, &run_dir);
    trainer_spec.transport = world.as_ref().map(|w| w.spec(0));
    trainer_spec.plugin_dirs = plugin_dirs.to_vec();
    let mut trainers = launcher.spawn_trainers(&[trainer_spec]).unwrap();
    let trainer = trainers.pop().unwrap();
    trainer.init().unwrap();
    Rig {
        _world: world,
        _dir: dir,
        run_dir,
        launcher,
        trainer,
        engines,
    }
}

pub(crate) fn batch(tokens: &[u32]) -> TrainBatch {
    batch_of(vec![seq(tokens, 1)], LossKind::Sft, 1e-2)
}

pub(crate) const TRAIN: [u32; 8] = [1, 40, 41, 42, 43, 44, 45, 2];
pub(crate) const PROBE: [u32; 6] = [1, 50, 51, 52, 53, 54];

impl Rig {
    /// Pauses the engines, trains one step (engines never run while the trainer writes).
    pub(crate) fn train_step(&self) {
        self.pause();
        let m = self.trainer.train_step(batch(&TRAIN)).unwrap();
        assert!(
            m.iter()
                .any(|x| x.name.as_str() == "applied" && x.value == 1.0)
        );
    }

    pub(crate) fn resume(&self) {
        for e in &self.engines {
            e.continue_generation().unwrap();
        }
    }

    /// Pauses the engines (updates, the ipc setup included, are applied to paused engines).
    pub(crate) fn pause(&self) {
        for e in &self.engines {
            e.pause_generation(PauseMode::Wait).unwrap();
        }
    }

    /// The trainer's logprobs of the probe's tokens after the first (what `score` returns).
    pub(crate) fn trainer_probe(&self) -> Vec<f32> {
        let lp = self
            .trainer
            .compute_logprobs(batch(&PROBE), WhichWeights::Current)
            .unwrap();
        lp[0].clone()
    }

    pub(crate) fn engine_probe(&self, i: usize) -> Vec<f32> {
        self.engines[i].score(vec![PROBE.to_vec()]).unwrap()[0].clone()
    }

    pub(crate) fn generate(&self, adapter: Option<String>) -> (Vec<u32>, u64) {
        let out = self.engines[0]
            .generate(GenerateRequest {
                prompts: vec![RVec::from(vec![1u32, 40, 41])].into(),
                sampling: SamplingParams {
                    temperature: 0.0,
                    max_tokens: 4,
                    ..SamplingParams::default()
                },
                adapter: adapter.map(|a| a.into()).into(),
            })
            .unwrap();
        (out.completions[0].tokens.to_vec(), out.weight_version)
    }

    /// Trains a step and exports a checkpoint (not applied): the update and its directory.
    pub(crate) fn train_and_export_checkpoint(&self) -> (WeightUpdate, PathBuf) {
        self.train_step();
        let update = self
            .trainer
            .export_weight_update(UpdateKind::CheckpointDir)
            .unwrap();
        let UpdatePayload::CheckpointDir { dir } = &update.payload else {
            panic!("{update:?}")
        };
        let dir = PathBuf::from(dir.as_str());
        (update, dir)
    }

    pub(crate) fn version(&self) -> u64 {
        self.engines[0].health().unwrap().weight_version
    }

    /// Stops the workers.
    pub(crate) fn shutdown(self) {
        self.launcher
            .shutdown(std::time::Duration::from_secs(10))
            .unwrap();
    }
}

pub(crate) fn no_options() -> toml::Table {
    toml::Table::new()
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Summed Pss (bytes) of the memfd-backed mappings of `pid`, from `/proc/<pid>/smaps`.
pub(crate) fn region_pss(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut in_memfd = false;
    let mut kb = 0u64;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            in_memfd = line.contains("/memfd:");
        } else if in_memfd && line.starts_with("Pss:") {
            kb += line
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap();
        }
    }
    kb * 1024
}
