//! Weight bridges: the sync driver the RL loop calls after each training step.
//!
//! [`BridgeDriver`] runs one of three modes chosen by the job file's `[bridge] mode`:
//!
//! - `ipc` (single copy): at [`setup`](BridgeDriver::setup) the trainer exports its weights
//!   region as a `SharedRegion` (region key + tensor layout + version + digest); every engine
//!   checks the layout (one clear error on a mismatch), maps the region and frees its own copy.
//!   A sync is then a fence + version bump with a digest of the mapped memory: 0 bytes copied.
//!   The trainer writes the region in place, so engines must be paused (not generating)
//!   while it trains — the loop pauses them; there is no double buffer (it would cost the
//!   second copy `ipc` exists to avoid). The trainer keeps `weights` resident
//!   ([`trainer_offload_tags`](BridgeDriver::trainer_offload_tags)) and engines never release
//!   them ([`engine_release_tags`](BridgeDriver::engine_release_tags)).
//! - `lora` (hot swap): the trainer writes a PEFT adapter atomically under
//!   `<run_dir>/adapters/v<N>`; every engine loads it as `native-v<N>`, checks its digest,
//!   switches to it between requests and unloads the previous one. No restart.
//! - `checkpoint`: the trainer writes an atomic HF checkpoint (`<run_dir>/weights/v<N>`:
//!   staging dir, every file and the dir fsynced, rename, parent fsynced). With `restart`
//!   (the default, `[bridge.options] restart = false` to reload in place) each engine rank is
//!   started anew on the checkpoint by the launcher, health-checked (ready, serving version
//!   N, digest) and only then replaces the old process, which is stopped; if the new one
//!   fails, it is stopped and the old one keeps serving the previous version.
//!
//! Every sync checks the version only goes up and, unless `[bridge] verify = false`,
//! compares the digest each engine reports for what it now serves with the trainer's (the
//! engine refuses to switch to weights whose digest differs): a mismatch fails the sync.
//!
//! Where the halves run: the trainer half (export, atomic write, digest) is the trainer
//! plugin's `export_weight_update` in the trainer's worker, the engine half (map / load /
//! switch / digest) the engine plugin's `apply_weight_update` in the engine's worker; the
//! controller-side part (restarts through the launcher, comparing digests, records) lives
//! here because only the controller owns processes. See ARCHITECTURE.md.

pub mod rss;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::RlError;
use tandem_runtime::launch::{LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_plugin_api::{
    BridgeMode, RString, RVec, TensorSpec, UpdatePayload, UpdateReport, WeightUpdate,
};

/// What one sync did (→ metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct SyncRecord {
    /// Weight version the engines serve after the sync.
    pub version: u64,
    /// `ipc`, `lora` or `checkpoint`.
    pub mode: String,
    /// Bytes shipped from the trainer to the engines (files each engine read; 0 for `ipc`).
    pub bytes_moved: u64,
    /// Wall time of the sync, export to verified.
    pub latency_s: f64,
    /// Peak memory of all worker processes during the sync: their summed proportional set
    /// size (Pss, shared pages counted once) at the start plus each one's growth to its RSS
    /// high-water mark (see [`rss`]).
    pub peak_rss_bytes: u64,
    /// The trainer's digest of the weights.
    pub digest: String,
    /// Every engine reported the trainer's digest (false when `verify` is off).
    pub verified: bool,
    /// Engines were restarted (checkpoint restart): they come back serving.
    pub restarted: bool,
}

/// Called with each restarted engine before its health check (tests use it to kill the
/// engine mid-restart).
pub type RestartHook = Box<dyn FnMut(&RemoteEngine) + Send>;

/// How long a graceful engine exit may take before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Drives weight syncs from a trainer to its engines in one bridge mode.
pub struct BridgeDriver {
    mode: BridgeMode,
    verify: bool,
    restart: bool,
    version: Option<u64>,
    adapter: Option<String>,
    /// The trainer region every engine serves in place (`ipc`, after the first apply): later
    /// updates of it ship without the tensor layout, which the engines checked then.
    attached: Option<String>,
    /// A shared region's key and tensor layout as the trainer first exported it (`ipc`): a
    /// trainer ships the layout with its first export of a region only, and the driver adds
    /// it back for an engine that has not attached the region.
    layout: Option<(String, RVec<TensorSpec>)>,
    hook: Option<RestartHook>,
}

/// `[bridge] mode` and `[bridge.options]` as the sync driver runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BridgeSettings {
    /// `ipc`, `lora` or `checkpoint` (`broadcast` is refused).
    pub mode: BridgeMode,
    /// Checkpoint syncs restart the engines (`restart`, default true) or reload in place.
    pub restart: bool,
}

/// A problem of the `[bridge]` table, keyed relative to it (`mode`, `options.restart`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeProblem {
    /// `mode` or `options.KEY`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: String,
}

impl std::fmt::Display for BridgeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bridge.{}: {} (help: {})",
            self.key, self.message, self.help
        )
    }
}

const MODES_HELP: &str = "use `ipc`, `lora` or `checkpoint`";

/// Parses `[bridge] mode` and `[bridge.options]` without side effects: what `tandem check`
/// (config validation) and [`BridgeDriver::new`] both run. Every problem is returned.
pub fn parse_settings(
    mode: &str,
    options: &toml::Table,
) -> Result<BridgeSettings, Vec<BridgeProblem>> {
    let problem = |key: String, message: String, help: &str| BridgeProblem {
        key,
        message,
        help: help.to_owned(),
    };
    let m = match BridgeMode::parse(mode) {
        Some(m @ (BridgeMode::Ipc | BridgeMode::Lora | BridgeMode::Checkpoint)) => m,
        Some(BridgeMode::Broadcast) => {
            return Err(vec![problem(
                "mode".into(),
                "bridge mode `broadcast` is not implemented by the sync driver yet".into(),
                MODES_HELP,
            )]);
        }
        None => {
            return Err(vec![problem(
                "mode".into(),
                format!("unknown bridge mode `{mode}`"),
                MODES_HELP,
            )]);
        }
    };
    let mut restart = true;
    let mut problems = Vec::new();
    for (k, v) in options {
        match (k.as_str(), m, v) {
            ("restart", BridgeMode::Checkpoint, toml::Value::Boolean(b)) => restart = *b,
            ("restart", BridgeMode::Checkpoint, other) => problems.push(problem(
                format!("options.{k}"),
                format!("must be true or false, not `{other}`"),
                "restart = true starts each engine anew on the checkpoint, false reloads it in \
                 place",
            )),
            _ => problems.push(problem(
                format!("options.{k}"),
                format!("`{k}` is not an option of bridge mode `{mode}`"),
                "the checkpoint mode takes `restart = true|false`; ipc and lora take none",
            )),
        }
    }
    if problems.is_empty() {
        Ok(BridgeSettings { mode: m, restart })
    } else {
        Err(problems)
    }
}

const TRAINER_TAGS: [&str; 4] = ["weights", "grads", "optimizer", "activations"];
const ENGINE_TAGS: [&str; 3] = ["weights", "kv_cache", "activations"];

impl BridgeDriver {
    /// `mode` = job file `[bridge] mode`, `verify` = `[bridge] verify`, options = `[bridge.options]`.
    /// Refuses what [`parse_settings`] refuses (validation already reported it, with positions).
    pub fn new(mode: &str, verify: bool, options: &toml::Table) -> Result<BridgeDriver, RlError> {
        let BridgeSettings { mode: m, restart } =
            parse_settings(mode, options).map_err(|problems| {
                RlError::usage(
                    problems
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("\n"),
                )
            })?;
        Ok(BridgeDriver {
            mode: m,
            verify,
            restart,
            version: None,
            adapter: None,
            attached: None,
            layout: None,
            hook: None,
        })
    }

    /// The mode's job-file name.
    pub fn mode(&self) -> &'static str {
        self.mode.as_str()
    }

    /// Whether checkpoint syncs restart the engines (`[bridge.options] restart`).
    pub fn restarts(&self) -> bool {
        self.mode == BridgeMode::Checkpoint && self.restart
    }

    /// The version the engines serve after the last sync (`None` before the first).
    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// Sets a hook called with each restarted engine before its health check.
    pub fn set_restart_hook(&mut self, hook: Option<RestartHook>) {
        self.hook = hook;
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
        all.iter()
            .filter(|t| !(self.mode == BridgeMode::Ipc && **t == "weights"))
            .map(|t| t.to_string())
            .collect()
    }

    /// Once, after the trainer's init and before the first sync (ipc: attach + layout check).
    pub fn setup(
        &mut self,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        _launcher: &mut LocalLauncher,
    ) -> Result<(), RlError> {
        if self.mode != BridgeMode::Ipc {
            return Ok(());
        }
        let update = self.export(trainer)?;
        self.remember_layout(&update);
        let reports = self.apply_all(&update, engines)?;
        self.check_reports(&update, &reports, engines)?;
        self.version = Some(update.version);
        tracing::info!(
            "ipc bridge: {} engine(s) serve the trainer's weights in place (v{}, {})",
            engines.len(),
            update.version,
            update.digest
        );
        Ok(())
    }

    /// One sync: trainer export → ship → every engine applies → verify. Engines are paused (not generating) when called.
    /// May replace elements of `engines` (checkpoint restart); then `restarted` is true and those engines come back serving with everything resident.
    pub fn sync(
        &mut self,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        // The meter reads the workers' memory before the clock starts and after it stops.
        let mut meter = rss::PeakMeter::start(launcher.live_pids());
        let start = Instant::now();
        let update = self.export(trainer)?;
        tracing::debug!(
            "{} sync: trainer export took {:.2} ms",
            self.mode(),
            start.elapsed().as_secs_f64() * 1e3
        );
        let mut rec = self.ship(update, engines, launcher, start, &mut meter)?;
        rec.peak_rss_bytes = meter.finish();
        Ok(rec)
    }

    /// Ships an update the trainer already exported (what [`sync`](Self::sync) does after
    /// the export): apply on every engine, or restart them on it, then verify.
    pub fn apply(
        &mut self,
        update: WeightUpdate,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
    ) -> Result<SyncRecord, RlError> {
        let mut meter = rss::PeakMeter::start(launcher.live_pids());
        let start = Instant::now();
        let mut rec = self.ship(update, engines, launcher, start, &mut meter)?;
        rec.peak_rss_bytes = meter.finish();
        Ok(rec)
    }

    /// The adapter name generate requests must carry (lora mode), None otherwise.
    pub fn request_adapter(&self) -> Option<String> {
        self.adapter.clone()
    }

    /// The trainer half of a sync: the trainer exports its weights in this mode's kind; the
    /// version may not go down and, with `verify`, a digest must come with it. The loop
    /// exports before it offloads the trainer and ships with [`apply`](Self::apply) once the
    /// engines' weights are back.
    pub fn export(&self, trainer: &RemoteTrainer) -> Result<WeightUpdate, RlError> {
        let update = trainer.export_weight_update(self.mode.update_kind())?;
        if let Some(v) = self.version
            && update.version < v
        {
            return Err(RlError::failed(format!(
                "{} bridge: the trainer exported weight version {} after version {v} was synced; \
                 versions only go up (help: resume the trainer from its latest checkpoint)",
                self.mode(),
                update.version
            )));
        }
        if self.verify && update.digest.is_empty() {
            return Err(RlError::usage(format!(
                "{} bridge: `[bridge] verify` is on but the trainer exported no weight digest \
                 (help: let the trainer compute digests, or set `verify = false`)",
                self.mode()
            )));
        }
        Ok(update)
    }

    fn ship(
        &mut self,
        update: WeightUpdate,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
        start: Instant,
        meter: &mut rss::PeakMeter,
    ) -> Result<SyncRecord, RlError> {
        let restarted = self.restarts();
        self.remember_layout(&update);
        let shipping = Instant::now();
        let (reports, bytes) = match (&update.payload, restarted) {
            (UpdatePayload::CheckpointDir { dir }, true) => {
                let dir = PathBuf::from(dir.as_str());
                let reports = self.restart_all(&update, &dir, engines, launcher, meter)?;
                (reports, dir_bytes(&dir) * engines.len() as u64)
            }
            (UpdatePayload::CheckpointDir { dir } | UpdatePayload::Adapter { dir, .. }, _) => {
                let bytes = dir_bytes(Path::new(dir.as_str())) * engines.len() as u64;
                (self.apply_all(&update, engines)?, bytes)
            }
            _ => (self.apply_all(&update, engines)?, 0),
        };
        tracing::debug!(
            "{} sync: shipping to the engines took {:.2} ms",
            self.mode(),
            shipping.elapsed().as_secs_f64() * 1e3
        );
        let verified = self.check_reports(&update, &reports, engines)?;
        match &update.payload {
            UpdatePayload::Adapter { name, .. } => self.adapter = Some(name.to_string()),
            UpdatePayload::SharedRegion { region, .. } => {
                self.attached = Some(region.key.to_string());
            }
            _ => {}
        }
        self.version = Some(update.version);
        Ok(SyncRecord {
            version: update.version,
            mode: self.mode().to_string(),
            bytes_moved: bytes,
            latency_s: start.elapsed().as_secs_f64(),
            peak_rss_bytes: 0,
            digest: update.digest.to_string(),
            verified,
            restarted,
        })
    }

    /// Keeps the tensor layout a shared-region update carries (see `layout`).
    fn remember_layout(&mut self, update: &WeightUpdate) {
        if let UpdatePayload::SharedRegion { region, tensors } = &update.payload
            && !tensors.is_empty()
        {
            self.layout = Some((region.key.to_string(), tensors.clone()));
        }
    }

    /// The update as engines get it: without the digest when verification is off, and for a
    /// shared region the engines already serve, without its tensor layout (checked when they
    /// attached it); a region they have not attached goes with the layout the trainer sent
    /// with its first export of it. Shipping a few hundred tensor specs through the control
    /// plane on every sync is what made an `ipc` sync grow with the number of tensors.
    fn shipped(&self, update: &WeightUpdate) -> Result<WeightUpdate, RlError> {
        let mut u = update.clone();
        if !self.verify {
            u.digest = RString::new();
        }
        if let UpdatePayload::SharedRegion { region, tensors } = &mut u.payload {
            let key = region.key.as_str();
            if self.attached.as_deref() == Some(key) {
                *tensors = RVec::new();
            } else if tensors.is_empty() {
                match &self.layout {
                    Some((k, t)) if k == key => *tensors = t.clone(),
                    _ => {
                        return Err(RlError::failed(format!(
                            "ipc bridge: the trainer exported region {key} without its tensor \
                             layout, and this bridge never received it (help: a trainer sends \
                             the layout with its first export of a region; set up the bridge \
                             with the trainer it syncs from)"
                        )));
                    }
                }
            }
        }
        Ok(u)
    }

    fn apply_all(
        &self,
        update: &WeightUpdate,
        engines: &[RemoteEngine],
    ) -> Result<Vec<UpdateReport>, RlError> {
        let shipped = self.shipped(update)?;
        let mut reports = Vec::with_capacity(engines.len());
        for (i, e) in engines.iter().enumerate() {
            let r = e.apply_weight_update(shipped.clone()).map_err(|err| {
                let mixed = mixed_note(i, update.version);
                RlError::failed(format!(
                    "{} bridge: {} kept serving its previous weights: {err}{mixed}",
                    self.mode(),
                    e.name()
                ))
            })?;
            reports.push(r);
        }
        Ok(reports)
    }

    /// Restarts every engine on the checkpoint `dir`: new process, hook, health check
    /// (ready, version, digest), then the old one is stopped and replaced.
    fn restart_all(
        &mut self,
        update: &WeightUpdate,
        dir: &Path,
        engines: &mut [RemoteEngine],
        launcher: &mut LocalLauncher,
        meter: &mut rss::PeakMeter,
    ) -> Result<Vec<UpdateReport>, RlError> {
        let shipped = self.shipped(update)?;
        let mut reports = Vec::with_capacity(engines.len());
        for (i, slot) in engines.iter_mut().enumerate() {
            let rank = slot.rank();
            let fail = |why: String| {
                let mixed = mixed_note(i, update.version);
                RlError::failed(format!(
                    "checkpoint bridge: restarting engine rank {rank} on {} failed, the old \
                     engine keeps serving its previous weights: {why}{mixed}",
                    dir.display()
                ))
            };
            if !dir.join("config.json").is_file() {
                return Err(fail(format!(
                    "{} has no config.json (the checkpoint vanished or is incomplete)",
                    dir.display()
                )));
            }
            let t = Instant::now();
            let new = launcher
                .respawn_engine(rank, dir)
                .map_err(|e| fail(e.to_string()))?;
            let started = t.elapsed();
            meter.add(new.pid());
            if let Some(h) = self.hook.as_mut() {
                h(&new);
            }
            let checked = (|| {
                let health = new.health()?;
                if !health.ready || health.weight_version != update.version {
                    return Err(RlError::failed(format!(
                        "{} is not ready at version {} after start (ready {}, version {}, {})",
                        new.name(),
                        update.version,
                        health.ready,
                        health.weight_version,
                        health.detail
                    )));
                }
                // Acknowledged without reloading: the engine serves exactly this dir and version.
                // Updates are applied to a paused engine (the lifecycle state machine).
                new.pause_generation(tandem_plugin_api::PauseMode::Wait)?;
                let report = new.apply_weight_update(shipped.clone())?;
                new.continue_generation()?;
                Ok(report)
            })();
            let healthy = t.elapsed();
            match checked {
                Ok(report) => {
                    let old = std::mem::replace(slot, new);
                    if let Err(e) = old.exit_and_wait(EXIT_GRACE) {
                        tracing::warn!("stopping the replaced {}: {e}", old.name());
                    }
                    tracing::debug!(
                        "checkpoint restart of engine rank {rank}: started in {:.1} ms, healthy \
                         at {:.1} ms, the old engine gone at {:.1} ms",
                        started.as_secs_f64() * 1e3,
                        healthy.as_secs_f64() * 1e3,
                        t.elapsed().as_secs_f64() * 1e3
                    );
                    reports.push(report);
                }
                Err(e) => {
                    new.kill("its restart on a new checkpoint failed");
                    return Err(fail(e.to_string()));
                }
            }
        }
        Ok(reports)
    }

    /// Compares every engine's digest with the trainer's (when verifying). Returns whether
    /// the check ran and passed.
    fn check_reports(
        &self,
        update: &WeightUpdate,
        reports: &[UpdateReport],
        engines: &[RemoteEngine],
    ) -> Result<bool, RlError> {
        for (r, e) in reports.iter().zip(engines) {
            if r.version != update.version {
                return Err(RlError::failed(format!(
                    "{} bridge: {} reports version {} after applying version {}",
                    self.mode(),
                    e.name(),
                    r.version,
                    update.version
                )));
            }
            if self.verify && r.digest != update.digest {
                return Err(RlError::failed(format!(
                    "{} bridge: weight digest mismatch on {}: the trainer exported {} (v{}), the \
                     engine serves {} (help: the weights were damaged in transit; the run must \
                     stop)",
                    self.mode(),
                    e.name(),
                    update.digest,
                    update.version,
                    if r.digest.is_empty() {
                        "no digest"
                    } else {
                        r.digest.as_str()
                    }
                )));
            }
        }
        Ok(self.verify && !update.digest.is_empty())
    }
}

/// Total size of the files directly in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The tail of a sync error when engines `0..failed` already switched to `version`.
fn mixed_note(failed: usize, version: u64) -> String {
    if failed > 0 {
        format!("; engines 0..{failed} already serve v{version}: the run must stop")
    } else {
        String::new()
    }
}
