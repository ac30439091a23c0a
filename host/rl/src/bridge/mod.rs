//! Weight bridges: the sync driver the RL loop calls after each training step.
//!
//! A bridge is a plugin component (`[bridge] plugin = "<component>"`; `mode` is the same key
//! under its older name): the built-ins `ipc`, `lora`, `checkpoint` and `broadcast` of the
//! `bridges` plugin, or a third party's. [`BridgeDriver`] owns the controller's part of every
//! bridge and nothing mode-specific: it installs the bridge's halves in the trainer and
//! engine workers, asks the trainer for the bridge's export kind, runs the trainer half there,
//! ships what it returned through each engine's half and apply — in rank order, or all at once
//! while the trainer half sends when the bridge moves data over the transport — and checks
//! every engine's version and digest. What a bridge needs from the controller it says in its
//! plan (`BridgePlan`): tags that stay resident, engine restarts on a checkpoint (only the
//! controller owns processes: `restart.rs`), a transport group, a sync before the first
//! rollout. The record of a sync is a [`SyncRecord`].
//!
//! The loop stages memory between the export and the shipping through [`SyncStages`]
//! ([`BridgeDriver::sync_staged`]); benchmarks and tests use [`BridgeDriver::sync`]. See
//! `BRIDGE-NOTES.md` beside this crate.

mod common;
mod outcome;
mod resolve;
mod restart;
pub mod rss;
mod ship;

pub use common::SyncRecord;
pub use resolve::{BridgeChoice, BridgeProblem, plan_of, resident_of, resolve};

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use crate::config::BridgeSetup;
use crate::error::RlError;
use common::Ledger;
use tandem_plugin_api::{BridgePlan, ResidentTags, Shipment, ShipmentBody, UpdatePayload};
use tandem_runtime::launch::{LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_runtime::registry::Registry;

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

/// Drives weight syncs from a trainer to its engines through one bridge component.
pub struct BridgeDriver {
    choice: BridgeChoice,
    plan: BridgePlan,
    /// Tags each side keeps resident (the bridge's `resident()`).
    resident: ResidentTags,
    ledger: Ledger,
    /// The adapter generate requests name (after a sync that shipped one).
    adapter: Option<String>,
    hook: Option<RestartHook>,
    /// The model the trainer started from: a checkpoint dir the bridge ships gets its
    /// companion files (tokenizer, generation config, chat template) before engines see it.
    source_model: Option<PathBuf>,
    /// Worker pids holding this bridge's half.
    installed: Mutex<HashSet<u32>>,
    /// The last shipment every engine applied, as the engines got it: what a replacement
    /// for a dead engine applies to serve what the others serve.
    shipped: Option<Shipment>,
}

const TRAINER_TAGS: [&str; 4] = ["weights", "grads", "optimizer", "activations"];
const ENGINE_TAGS: [&str; 3] = ["weights", "kv_cache", "activations"];

/// The tags of `all` that are not `resident`.
fn tags(all: &[&str], resident: &[tandem_plugin_api::RString]) -> Vec<String> {
    all.iter()
        .filter(|t| !resident.iter().any(|r| r.as_str() == **t))
        .map(|t| t.to_string())
        .collect()
}

impl BridgeDriver {
    /// The bridge a run's plan chose, with the plan its component answered (validation
    /// resolved it: [`resolve`], then [`plan_of`]).
    pub fn new(setup: &BridgeSetup) -> BridgeDriver {
        BridgeDriver {
            ledger: Ledger {
                name: setup.component.clone(),
                verify: setup.verify,
                version: None,
            },
            choice: BridgeChoice {
                component: setup.component.clone(),
                plugin: setup.plugin.clone(),
                options_json: setup.options_json.clone(),
                export: setup.export,
                apply: setup.apply,
            },
            plan: setup.plan.clone(),
            resident: setup.resident.clone(),
            adapter: None,
            hook: None,
            source_model: None,
            installed: Mutex::new(HashSet::new()),
            shipped: None,
        }
    }

    /// [`new`](Self::new) with the registry of this process's built-in plugins and the
    /// plugin libraries beside its executable (benchmarks and tests).
    pub fn builtin(
        name: &str,
        verify: bool,
        options: &toml::Table,
    ) -> Result<BridgeDriver, RlError> {
        let registry = Registry::discover(&[])
            .map_err(|e| RlError::Runtime(tandem_runtime::RuntimeError::Plugins(e)))?;
        BridgeDriver::from_registry(&registry, name, verify, options)
    }

    /// The bridge component `name` of `registry` with `options` (`[bridge.options]`),
    /// resolved and planned as validation does it (benchmarks and tests).
    pub fn from_registry(
        registry: &Registry,
        name: &str,
        verify: bool,
        options: &toml::Table,
    ) -> Result<BridgeDriver, RlError> {
        let choice = resolve(registry, name, options).map_err(|p| resolve::problems_error(&p))?;
        let plan = plan_of(registry, &choice)?;
        let resident = resident_of(registry, &choice)?;
        Ok(BridgeDriver::new(&BridgeSetup {
            component: choice.component,
            plugin: choice.plugin,
            options_json: choice.options_json,
            export: choice.export,
            apply: choice.apply,
            verify,
            plan,
            resident,
        }))
    }

    /// Sets the model the trainer started from: every checkpoint dir the bridge ships is
    /// completed with its companion files before an engine sees it
    /// (`tandem_model::companion`), so a restarted engine, Hugging Face tools and vLLM load
    /// it as it is.
    pub fn set_source_model(&mut self, dir: &Path) {
        self.source_model = Some(dir.to_path_buf());
    }

    /// The bridge component's name.
    pub fn mode(&self) -> &str {
        &self.ledger.name
    }

    /// The bridge as resolved (component, plugin, kinds).
    pub fn choice(&self) -> &BridgeChoice {
        &self.choice
    }

    /// What the bridge asked of the controller.
    pub fn plan(&self) -> &BridgePlan {
        &self.plan
    }

    /// Whether syncs restart the engines (`checkpoint`, `restart = true`).
    pub fn restarts(&self) -> bool {
        self.plan.restart_engines
    }

    /// Whether the bridge moves data over the transport group `bridge`: the workers must be
    /// launched in a transport world that has it (trainer rank 0 first, then the engines).
    pub fn needs_transport(&self) -> bool {
        self.plan.transport
    }

    /// The version the engines serve after the last sync (`None` before the first).
    pub fn version(&self) -> Option<u64> {
        self.ledger.version
    }

    /// Sets a hook called with each restarted engine before its health check.
    pub fn set_restart_hook(&mut self, hook: Option<RestartHook>) {
        self.hook = hook;
    }

    /// Tags the loop may offload on the trainer after training (not the bridge's resident
    /// tags on the trainer's side, e.g. `weights` for `ipc`).
    pub fn trainer_offload_tags(&self) -> Vec<String> {
        tags(&TRAINER_TAGS, &self.resident.trainer)
    }

    /// Tags the drained offload releases on engines (not the bridge's resident tags on the
    /// engines' side).
    pub fn engine_release_tags(&self) -> Vec<String> {
        tags(&ENGINE_TAGS, &self.resident.engines)
    }

    /// The adapter name generate requests must carry (after a sync that shipped an adapter).
    pub fn request_adapter(&self) -> Option<String> {
        self.adapter.clone()
    }

    /// Installs the bridge's half in a worker unless it holds it already.
    fn install(
        &self,
        pid: u32,
        install: impl FnOnce() -> Result<BridgePlan, tandem_runtime::RuntimeError>,
    ) -> Result<(), RlError> {
        let mut done = self.installed.lock().unwrap_or_else(|p| p.into_inner());
        if done.contains(&pid) {
            return Ok(());
        }
        let plan = install()?;
        if plan != self.plan {
            return Err(RlError::failed(format!(
                "{} bridge: a worker's instance plans {plan:?}, the controller's {:?}",
                self.ledger.name, self.plan
            ))
            .with_help("the bridge's plan must depend on its options only"));
        }
        done.insert(pid);
        Ok(())
    }

    fn install_trainer(&self, trainer: &RemoteTrainer, engines: usize) -> Result<(), RlError> {
        let c = &self.choice;
        self.install(trainer.pid(), || {
            trainer.bridge_install(&c.component, &c.options_json, engines as u32)
        })
    }

    fn install_engine(&self, engine: &RemoteEngine, engines: usize) -> Result<(), RlError> {
        let c = &self.choice;
        self.install(engine.pid(), || {
            engine.bridge_install(&c.component, &c.options_json, engines as u32)
        })
    }

    fn install_all(
        &self,
        trainer: &RemoteTrainer,
        engines: &[RemoteEngine],
    ) -> Result<(), RlError> {
        self.install_trainer(trainer, engines.len())?;
        engines
            .iter()
            .try_for_each(|e| self.install_engine(e, engines.len()))
    }

    /// Once, after the trainer's init and before the first sync: installs the bridge's halves
    /// in the workers and, when its plan asks (`ipc`), syncs the trainer's current weights.
    pub fn setup(
        &mut self,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
    ) -> Result<(), RlError> {
        self.install_all(trainer, engines)?;
        if self.plan.sync_at_start {
            let rec = self.sync(trainer, engines, launcher)?;
            tracing::info!(
                "{} bridge: {} engine(s) serve the trainer's weights (v{}, {})",
                self.mode(),
                engines.len(),
                rec.version,
                rec.digest
            );
        }
        Ok(())
    }

    /// Where a replacement for a dead engine starts: the last shipped checkpoint directory
    /// when the bridge restarts engines on its updates (`checkpoint`), else `None` (the
    /// job's model, brought up to date by [`restore_engine`](Self::restore_engine)).
    pub fn engine_start_dir(&self) -> Option<PathBuf> {
        match (&self.shipped, self.restarts()) {
            (Some(u), true) => match &u.body {
                ShipmentBody::Update(UpdatePayload::CheckpointDir { dir }) => {
                    Some(PathBuf::from(dir.as_str()))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// Brings `engine`, a replacement for a dead engine (started on
    /// [`engine_start_dir`](Self::engine_start_dir) or the job's model), to what the other
    /// engines serve: installs the bridge's half and, with `apply`, applies the last
    /// shipped update (paused, checked like a sync: version and digest). The version it
    /// serves then, or `None` when it was left as it started (nothing shipped yet, or the
    /// caller syncs it with the others next).
    pub fn restore_engine(
        &self,
        engine: &RemoteEngine,
        engines: usize,
        apply: bool,
    ) -> Result<Option<u64>, RlError> {
        self.install_engine(engine, engines)?;
        let Some(update) = self.shipped.as_ref().filter(|_| apply) else {
            return Ok(None);
        };
        engine.pause_generation(tandem_plugin_api::PauseMode::Wait)?;
        let report = engine.bridge_apply(update.clone())?;
        self.ledger.check_reports(
            update,
            std::slice::from_ref(&report),
            std::slice::from_ref(engine),
        )?;
        engine.continue_generation()?;
        Ok(Some(update.version))
    }

    /// The trainer half: the trainer exports the bridge's kind and the bridge turns it into
    /// what ships; checked (versions only go up, a digest when verifying).
    fn export(&self, trainer: &RemoteTrainer, engines: usize) -> Result<Shipment, RlError> {
        self.install_trainer(trainer, engines)?;
        let shipped = trainer.bridge_export(self.choice.export)?;
        self.ledger.check_export(&shipped)?;
        Ok(shipped)
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
        let update = self.export(trainer, engines.len())?;
        tracing::debug!(
            "{} sync: trainer export took {:.2} ms",
            self.mode(),
            start.elapsed().as_secs_f64() * 1e3
        );
        let rec = self.ship(update, trainer, engines, launcher, &mut meter)?;
        Ok(SyncRecord {
            latency_s: start.elapsed().as_secs_f64(),
            peak_rss_bytes: meter.finish(),
            ..rec
        })
    }

    /// The loop's sync: the trainer exports, `stages` make room (the trainer's offload, the
    /// engines' weights back), then the update is shipped and verified. The trainer half
    /// reads the trainer's weights, so it runs before any trainer offload. The record's
    /// clock covers both halves (the export with the trainer half, then the shipping) but
    /// not the staging between them; its memory meter covers the shipping.
    pub fn sync_staged(
        &mut self,
        stages: &mut dyn SyncStages,
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        let engines = stages.engines().len();
        let exporting = Instant::now();
        let update = self.export(stages.trainer(), engines)?;
        let export_s = exporting.elapsed().as_secs_f64();
        stages.exported(update.version, self.restarts())?;
        let trainer = stages.trainer().clone();
        self.apply_from(&trainer, update, stages.engines(), launcher)
            .map(|rec| SyncRecord {
                latency_s: rec.latency_s + export_s,
                ..rec
            })
            .inspect_err(|_| stages.failed())
    }

    /// Ships an update as the trainer half returns it: through every engine's half and apply
    /// (or a restart on it), then verified. (A bridge that sends over the transport needs its
    /// trainer half: use [`sync`](Self::sync).)
    pub fn apply(
        &mut self,
        update: Shipment,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        self.install_trainer(trainer, engines.len())?;
        self.apply_from(trainer, update, engines, launcher)
    }

    fn apply_from(
        &mut self,
        trainer: &RemoteTrainer,
        update: Shipment,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        let mut meter = rss::PeakMeter::start(launcher.live_pids());
        let start = Instant::now();
        let rec = self.ship(update, trainer, engines, launcher, &mut meter)?;
        Ok(SyncRecord {
            latency_s: start.elapsed().as_secs_f64(),
            peak_rss_bytes: meter.finish(),
            ..rec
        })
    }

    /// Ships, verifies and records (`latency_s` and `peak_rss_bytes` are the caller's).
    fn ship(
        &mut self,
        update: Shipment,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
        meter: &mut rss::PeakMeter,
    ) -> Result<SyncRecord, RlError> {
        let shipped = self.ship_unconcluded(&update, trainer, engines, launcher, meter);
        outcome::conclude(trainer, update.version, shipped.is_ok());
        let rec = shipped?;
        Ok(SyncRecord {
            bridge_stats: outcome::stats(trainer, engines),
            ..rec
        })
    }

    /// Ships and verifies, before the trainer half learns the outcome.
    fn ship_unconcluded(
        &mut self,
        update: &Shipment,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
        meter: &mut rss::PeakMeter,
    ) -> Result<SyncRecord, RlError> {
        let restarted = self.restarts();
        let shipping = Instant::now();
        let bytes = common::shipped_bytes(update, engines.len());
        if let (ShipmentBody::Update(UpdatePayload::CheckpointDir { dir }), Some(source)) =
            (&update.body, &self.source_model)
            && Path::new(dir.as_str()).is_dir()
        {
            // (A vanished dir is the bridge's to report: the engines keep their weights.)
            tandem_model::companion::complete(source, Path::new(dir.as_str()))?;
        }
        let n = engines.len();
        let reports = if restarted {
            let mut hook = self.hook.take();
            let install = |e: &RemoteEngine| self.install_engine(e, n);
            let restarts = restart::Restarts {
                engines: &mut *engines,
                launcher,
                meter,
                hook: hook.as_mut(),
                install: &install,
            };
            let done = restart::restart_all(&self.ledger, update, restarts);
            self.hook = hook;
            done?
        } else {
            engines.iter().try_for_each(|e| self.install_engine(e, n))?;
            if self.plan.transport {
                ship::together(&self.ledger, update, trainer, engines)?
            } else {
                ship::in_order(&self.ledger, update, engines)?
            }
        };
        tracing::debug!(
            "{} sync: shipping to the engines took {:.2} ms",
            self.mode(),
            shipping.elapsed().as_secs_f64() * 1e3
        );
        let verified = self.ledger.check_reports(update, &reports, engines)?;
        if let ShipmentBody::Update(UpdatePayload::Adapter { name, .. }) = &update.body {
            self.adapter = Some(name.to_string());
        }
        self.ledger.version = Some(update.version);
        self.shipped = Some(self.ledger.for_engines(update));
        Ok(SyncRecord {
            version: update.version,
            mode: self.mode().to_string(),
            bytes_moved: bytes,
            latency_s: 0.0,
            peak_rss_bytes: 0,
            digest: update.digest.to_string(),
            verified,
            restarted,
            bridge_stats: Vec::new(),
        })
    }
}
