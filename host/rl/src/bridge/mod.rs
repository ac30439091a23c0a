//! Weight bridges: the sync driver the RL loop calls after each training step.
//!
//! [`BridgeDriver`] runs one of three modes chosen by the job file's `[bridge] mode`, one
//! module each behind the internal `Mode` trait: `ipc` (engines serve the trainer's weights
//! region in place), `lora` (hot-swapped PEFT adapters), `checkpoint` (atomic HF
//! checkpoints, engines restarted on them or reloading in place). What they share — the
//! version bookkeeping, the digest checks, shipping to every engine, the [`SyncRecord`] — is
//! in `common`; `[bridge]` settings are parsed by [`parse_settings`] (what `tandem check`
//! runs too).
//!
//! A sync is: the trainer exports (versions only go up; with `verify` a digest comes with
//! it) → the mode ships the update to every engine (or restarts them on it) → every engine
//! reports what it now serves, compared with the trainer's digest unless `[bridge] verify =
//! false` (an engine already refuses to switch to weights whose digest differs) → the
//! record. The loop stages memory between the export and the shipping through
//! [`SyncStages`] ([`BridgeDriver::sync_staged`]); benchmarks and tests use
//! [`BridgeDriver::sync`].
//!
//! Where the halves run: the trainer half (export, atomic write, digest) is the trainer
//! plugin's `export_weight_update` in the trainer's worker, the engine half (map / load /
//! switch / digest) the engine plugin's `apply_weight_update` in the engine's worker; the
//! controller-side part (restarts through the launcher, comparing digests, records) lives
//! here because only the controller owns processes. See `BRIDGE-NOTES.md` beside this crate.

mod checkpoint;
mod common;
mod ipc;
mod lora;
pub mod rss;
mod settings;

pub use common::SyncRecord;
pub use settings::{BridgeProblem, BridgeSettings, parse_settings};

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::RlError;
use common::Common;
use tandem_plugin_api::{BridgeMode, UpdatePayload, UpdateReport, WeightUpdate};
use tandem_runtime::launch::{LocalLauncher, RemoteEngine, RemoteTrainer};

/// Called with each restarted engine before its health check (tests use it to kill the
/// engine mid-restart).
pub type RestartHook = Box<dyn FnMut(&RemoteEngine) + Send>;

/// What the loop does while a sync is under way ([`BridgeDriver::sync_staged`]).
pub trait SyncStages {
    /// The trainer the update comes from.
    fn trainer(&self) -> &RemoteTrainer;
    /// The engines the update goes to (a checkpoint restart replaces elements).
    fn engines(&mut self) -> &mut [RemoteEngine];
    /// Called after the trainer exported `version`, before anything is shipped: the engines
    /// must be able to take it when this returns. `restarting`: they are about to be
    /// replaced by new processes started on the update.
    fn exported(&mut self, version: u64, restarting: bool) -> Result<(), RlError>;
    /// The shipping failed: the engines keep their previous weights.
    fn failed(&mut self);
}

/// One update on its way to the engines.
struct Shipment<'a> {
    update: &'a WeightUpdate,
    engines: &'a mut [RemoteEngine],
    launcher: &'a mut LocalLauncher,
    meter: &'a mut rss::PeakMeter,
}

/// What differs between the bridge modes.
trait Mode: Send {
    /// Brings `update` to every engine; one report per engine, in rank order.
    fn ship(
        &mut self,
        common: &Common,
        shipment: Shipment<'_>,
    ) -> Result<Vec<UpdateReport>, RlError>;
    /// Bookkeeping once `update` was shipped and verified.
    fn shipped(&mut self, _update: &WeightUpdate) {}
    /// Once, after the trainer's init and before the first sync.
    fn setup(
        &mut self,
        _common: &mut Common,
        _trainer: &RemoteTrainer,
        _engines: &mut [RemoteEngine],
    ) -> Result<(), RlError> {
        Ok(())
    }
    /// The engines serve the trainer's weights memory: neither side may let go of it.
    fn keeps_weights_resident(&self) -> bool {
        false
    }
    /// A sync starts the engines anew on the update.
    fn restarts(&self) -> bool {
        false
    }
    /// The adapter generate requests must name.
    fn adapter(&self) -> Option<String> {
        None
    }
    /// See [`BridgeDriver::set_restart_hook`].
    fn set_restart_hook(&mut self, _hook: Option<RestartHook>) {}
}

/// Drives weight syncs from a trainer to its engines in one bridge mode.
pub struct BridgeDriver {
    common: Common,
    mode: Box<dyn Mode>,
    /// The model the trainer started from: a checkpoint dir the trainer exports gets its
    /// companion files (tokenizer, generation config, chat template) before it is shipped.
    source_model: Option<PathBuf>,
}

const TRAINER_TAGS: [&str; 4] = ["weights", "grads", "optimizer", "activations"];
const ENGINE_TAGS: [&str; 3] = ["weights", "kv_cache", "activations"];

impl BridgeDriver {
    /// `mode` = job file `[bridge] mode`, `verify` = `[bridge] verify`, options =
    /// `[bridge.options]`. Refuses what [`parse_settings`] refuses (validation already
    /// reported it, with positions).
    pub fn new(mode: &str, verify: bool, options: &toml::Table) -> Result<BridgeDriver, RlError> {
        let BridgeSettings { mode, restart } =
            parse_settings(mode, options).map_err(|p| settings::problems_error(&p))?;
        let driver: Box<dyn Mode> = match mode {
            BridgeMode::Ipc => Box::<ipc::Ipc>::default(),
            BridgeMode::Lora => Box::<lora::Lora>::default(),
            _ => Box::new(checkpoint::Checkpoint {
                restart,
                hook: None,
            }),
        };
        Ok(BridgeDriver {
            common: Common {
                mode,
                verify,
                version: None,
            },
            mode: driver,
            source_model: None,
        })
    }

    /// Sets the model the trainer started from: every checkpoint dir the trainer exports is
    /// completed with its companion files before an engine sees it
    /// (`tandem_model::companion`), so a restarted engine, Hugging Face tools and vLLM load
    /// it as it is.
    pub fn set_source_model(&mut self, dir: &Path) {
        self.source_model = Some(dir.to_path_buf());
    }

    /// The mode's job-file name.
    pub fn mode(&self) -> &'static str {
        self.common.mode.as_str()
    }

    /// Whether checkpoint syncs restart the engines (`[bridge.options] restart`).
    pub fn restarts(&self) -> bool {
        self.mode.restarts()
    }

    /// The version the engines serve after the last sync (`None` before the first).
    pub fn version(&self) -> Option<u64> {
        self.common.version
    }

    /// Sets a hook called with each restarted engine before its health check.
    pub fn set_restart_hook(&mut self, hook: Option<RestartHook>) {
        self.mode.set_restart_hook(hook);
    }

    /// Tags the loop may offload on the trainer after training (ipc: excludes "weights").
    pub fn trainer_offload_tags(&self) -> Vec<String> {
        self.tags(&TRAINER_TAGS)
    }

    /// Tags the drained offload releases on engines (ipc: excludes the shared weights).
    pub fn engine_release_tags(&self) -> Vec<String> {
        self.tags(&ENGINE_TAGS)
    }

    fn tags(&self, all: &[&str]) -> Vec<String> {
        let resident = self.mode.keeps_weights_resident();
        all.iter()
            .filter(|t| !(resident && **t == "weights"))
            .map(|t| t.to_string())
            .collect()
    }

    /// The adapter name generate requests must carry (lora mode), None otherwise.
    pub fn request_adapter(&self) -> Option<String> {
        self.mode.adapter()
    }

    /// Once, after the trainer's init and before the first sync (ipc: attach + layout check).
    pub fn setup(
        &mut self,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        _launcher: &mut LocalLauncher,
    ) -> Result<(), RlError> {
        self.mode.setup(&mut self.common, trainer, engines)
    }

    /// One sync, export to verified, nothing in between. Engines are paused (not generating)
    /// when called. May replace elements of `engines` (checkpoint restart); then `restarted`
    /// is true and those engines come back serving with everything resident.
    pub fn sync(
        &mut self,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        // The meter reads the workers' memory before the clock starts and after it stops.
        let mut meter = rss::PeakMeter::start(launcher.live_pids());
        let start = Instant::now();
        let update = self.common.export(trainer)?;
        tracing::debug!(
            "{} sync: trainer export took {:.2} ms",
            self.mode(),
            start.elapsed().as_secs_f64() * 1e3
        );
        let rec = self.ship(update, engines, launcher, &mut meter)?;
        Ok(SyncRecord {
            latency_s: start.elapsed().as_secs_f64(),
            peak_rss_bytes: meter.finish(),
            ..rec
        })
    }

    /// The loop's sync: the trainer exports, `stages` make room (the trainer's offload, the
    /// engines' weights back), then the update is shipped and verified. The trainer half
    /// reads the trainer's weights, so it runs before any trainer offload. The record's
    /// clock and memory meter cover the shipping (what [`apply`](Self::apply) measures).
    pub fn sync_staged(
        &mut self,
        stages: &mut dyn SyncStages,
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        let update = self.common.export(stages.trainer())?;
        stages.exported(update.version, self.restarts())?;
        self.apply(update, stages.engines(), launcher)
            .inspect_err(|_| stages.failed())
    }

    /// Ships an update the trainer already exported: apply on every engine, or restart them
    /// on it, then verify.
    pub fn apply(
        &mut self,
        update: WeightUpdate,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        let mut meter = rss::PeakMeter::start(launcher.live_pids());
        let start = Instant::now();
        let rec = self.ship(update, engines, launcher, &mut meter)?;
        Ok(SyncRecord {
            latency_s: start.elapsed().as_secs_f64(),
            peak_rss_bytes: meter.finish(),
            ..rec
        })
    }

    /// Ships, verifies and records (`latency_s` and `peak_rss_bytes` are the caller's).
    fn ship(
        &mut self,
        update: WeightUpdate,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
        meter: &mut rss::PeakMeter,
    ) -> Result<SyncRecord, RlError> {
        let restarted = self.restarts();
        let shipping = Instant::now();
        let bytes = common::shipped_bytes(&update, engines.len());
        if let (UpdatePayload::CheckpointDir { dir }, Some(source)) =
            (&update.payload, &self.source_model)
            && Path::new(dir.as_str()).is_dir()
        {
            // (A vanished dir is the mode's to report: the engines keep their weights.)
            tandem_model::companion::complete(source, Path::new(dir.as_str()))?;
        }
        let shipment = Shipment {
            update: &update,
            engines: &mut *engines,
            launcher,
            meter,
        };
        let reports = self.mode.ship(&self.common, shipment)?;
        tracing::debug!(
            "{} sync: shipping to the engines took {:.2} ms",
            self.mode(),
            shipping.elapsed().as_secs_f64() * 1e3
        );
        let verified = self.common.check_reports(&update, &reports, engines)?;
        self.mode.shipped(&update);
        self.common.version = Some(update.version);
        Ok(SyncRecord {
            version: update.version,
            mode: self.mode().to_string(),
            bytes_moved: bytes,
            latency_s: 0.0,
            peak_rss_bytes: 0,
            digest: update.digest.to_string(),
            verified,
            restarted,
        })
    }
}
