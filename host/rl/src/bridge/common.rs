//! What every bridge mode shares: the version bookkeeping (versions only go up), the digest
//! checks on both ends of a sync, shipping one update to every engine, and the sync's record.

use std::path::Path;

use crate::error::RlError;
use tandem_plugin_api::{BridgeMode, RString, UpdatePayload, UpdateReport, WeightUpdate};
use tandem_runtime::launch::{RemoteEngine, RemoteTrainer};

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
    /// high-water mark (see [`super::rss`]).
    pub peak_rss_bytes: u64,
    /// The trainer's digest of the weights.
    pub digest: String,
    /// Every engine reported the trainer's digest (false when `verify` is off).
    pub verified: bool,
    /// Engines were restarted (checkpoint restart): they come back serving.
    pub restarted: bool,
}

/// The mode-independent state of a bridge: its mode, whether it verifies, and the version
/// the engines serve.
pub(super) struct Common {
    pub mode: BridgeMode,
    pub verify: bool,
    /// The version the engines serve after the last sync (`None` before the first).
    pub version: Option<u64>,
}

impl Common {
    /// The trainer half of a sync: the trainer exports its weights in this mode's kind; the
    /// version may not go down and, with `verify`, a digest must come with it.
    pub fn export(&self, trainer: &RemoteTrainer) -> Result<WeightUpdate, RlError> {
        let update = trainer.export_weight_update(self.mode.update_kind())?;
        let mode = self.mode.as_str();
        if let Some(v) = self.version
            && update.version < v
        {
            return Err(RlError::failed(format!(
                "{mode} bridge: the trainer exported weight version {} after version {v} was \
                 synced; versions only go up",
                update.version
            ))
            .with_help("resume the trainer from its latest checkpoint"));
        }
        if self.verify && update.digest.is_empty() {
            return Err(RlError::usage(format!(
                "{mode} bridge: `[bridge] verify` is on but the trainer exported no weight digest"
            ))
            .with_help("let the trainer compute digests, or set `verify = false`"));
        }
        Ok(update)
    }

    /// The update as engines get it: without the digest when verification is off.
    pub fn for_engines(&self, update: &WeightUpdate) -> WeightUpdate {
        let mut u = update.clone();
        if !self.verify {
            u.digest = RString::new();
        }
        u
    }

    /// Applies `shipped` on every engine in rank order; the first failure names the engine,
    /// says it kept its previous weights and whether others already switched.
    pub fn apply_all(
        &self,
        update: &WeightUpdate,
        shipped: &WeightUpdate,
        engines: &[RemoteEngine],
    ) -> Result<Vec<UpdateReport>, RlError> {
        let mut reports = Vec::with_capacity(engines.len());
        for (i, e) in engines.iter().enumerate() {
            let r = e.apply_weight_update(shipped.clone()).map_err(|err| {
                RlError::failed(format!(
                    "{} bridge: {} kept serving its previous weights: {err}{}",
                    self.mode.as_str(),
                    e.name(),
                    mixed_note(i, update.version)
                ))
            })?;
            reports.push(r);
        }
        Ok(reports)
    }

    /// Compares every engine's version and (when verifying) digest with the trainer's.
    /// Returns whether the digest check ran and passed.
    pub fn check_reports(
        &self,
        update: &WeightUpdate,
        reports: &[UpdateReport],
        engines: &[RemoteEngine],
    ) -> Result<bool, RlError> {
        let mode = self.mode.as_str();
        for (r, e) in reports.iter().zip(engines) {
            if r.version != update.version {
                return Err(RlError::failed(format!(
                    "{mode} bridge: {} reports version {} after applying version {}",
                    e.name(),
                    r.version,
                    update.version
                )));
            }
            if self.verify && r.digest != update.digest {
                let served = if r.digest.is_empty() {
                    "no digest"
                } else {
                    r.digest.as_str()
                };
                return Err(RlError::failed(format!(
                    "{mode} bridge: weight digest mismatch on {}: the trainer exported {} (v{}), \
                     the engine serves {served}",
                    e.name(),
                    update.digest,
                    update.version,
                ))
                .with_help("the weights were damaged in transit; the run must stop"));
            }
        }
        Ok(self.verify && !update.digest.is_empty())
    }
}

/// Bytes an update ships to `engines` engines: the files of its directory each engine reads
/// (checkpoint, adapter), nothing for a shared region.
pub(super) fn shipped_bytes(update: &WeightUpdate, engines: usize) -> u64 {
    match &update.payload {
        UpdatePayload::CheckpointDir { dir } | UpdatePayload::Adapter { dir, .. } => {
            dir_bytes(Path::new(dir.as_str())) * engines as u64
        }
        _ => 0,
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
pub(super) fn mixed_note(failed: usize, version: u64) -> String {
    if failed > 0 {
        format!("; engines 0..{failed} already serve v{version}: the run must stop")
    } else {
        String::new()
    }
}
