//! What every bridge shares on the controller's side: the version bookkeeping (versions only
//! go up), the digest checks on both ends of a sync, the bytes a sync moved, and its record.

use std::path::Path;

use crate::error::RlError;
use tandem_plugin_api::files::dir_bytes;
use tandem_plugin_api::{RString, Shipment, ShipmentBody, UpdatePayload, UpdateReport};
use tandem_runtime::launch::RemoteEngine;

/// What one sync did (→ metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct SyncRecord {
    /// Weight version the engines serve after the sync.
    pub version: u64,
    /// The bridge component (`ipc`, `lora`, `checkpoint`, `broadcast`, a third party's).
    pub mode: String,
    /// Bytes shipped from the trainer to the engines (files each engine read, buckets each
    /// engine received; 0 for `ipc`).
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
    /// The bridge's own figures for this sync (`stats()`): its trainer half's by name, its
    /// engine halves' summed as `engines.<name>`.
    pub bridge_stats: Vec<(String, f64)>,
}

/// The controller's bookkeeping of a bridge: its name, whether it verifies, and the version
/// the engines serve.
pub(super) struct Ledger {
    pub name: String,
    pub verify: bool,
    /// The version the engines serve after the last sync (`None` before the first).
    pub version: Option<u64>,
}

impl Ledger {
    /// Checks what the trainer half shipped: the version may not go down and, with `verify`,
    /// a digest must come with it.
    pub fn check_export(&self, update: &Shipment) -> Result<(), RlError> {
        let name = &self.name;
        if let Some(v) = self.version
            && update.version < v
        {
            return Err(RlError::failed(format!(
                "{name} bridge: the trainer exported weight version {} after version {v} was \
                 synced; versions only go up",
                update.version
            ))
            .with_help("resume the trainer from its latest checkpoint"));
        }
        if self.verify && update.digest.is_empty() {
            return Err(RlError::usage(format!(
                "{name} bridge: `[bridge] verify` is on but the trainer exported no weight digest"
            ))
            .with_help("let the trainer compute digests, or set `verify = false`"));
        }
        Ok(())
    }

    /// The update as engines get it: without the digest when verification is off.
    pub fn for_engines(&self, update: &Shipment) -> Shipment {
        let mut u = update.clone();
        if !self.verify {
            u.digest = RString::new();
        }
        u
    }

    /// Compares every engine's version and (when verifying) digest with the shipped update.
    /// Returns whether the digest check ran and passed.
    pub fn check_reports(
        &self,
        update: &Shipment,
        reports: &[UpdateReport],
        engines: &[RemoteEngine],
    ) -> Result<bool, RlError> {
        let name = &self.name;
        for (r, e) in reports.iter().zip(engines) {
            if r.version != update.version {
                return Err(RlError::failed(format!(
                    "{name} bridge: {} reports version {} after applying version {}",
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
                    "{name} bridge: weight digest mismatch on {}: the trainer exported {} (v{}), \
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

/// Bytes a shipment moves to `engines` engines: the files of its directory each engine reads
/// (checkpoint, adapter), the buckets each receives, what a bridge-owned payload says it
/// puts on the wire to each, nothing for a shared region.
pub(super) fn shipped_bytes(update: &Shipment, engines: usize) -> u64 {
    let each = match &update.body {
        ShipmentBody::Update(
            UpdatePayload::CheckpointDir { dir } | UpdatePayload::Adapter { dir, .. },
        ) => dir_bytes(Path::new(dir.as_str())),
        _ => update.wire_bytes().unwrap_or(0),
    };
    each * engines as u64
}

/// The tail of a sync error when the engines at `switched` already serve `version`.
pub(super) fn mixed_note(switched: &[usize], version: u64) -> String {
    match switched {
        [] => String::new(),
        [one] => format!("; engine {one} already serves v{version}: the run must stop"),
        many => {
            let list: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!(
                "; engines {} already serve v{version}: the run must stop",
                list.join(", ")
            )
        }
    }
}

/// A worker's error without the worker's name (the sync's error names it once) and its
/// help, if it has one, apart (the sync's error carries one help).
pub(super) fn cause(err: &tandem_runtime::RuntimeError, worker: &str) -> (String, Option<String>) {
    use tandem_control::ControlError;
    use tandem_runtime::RuntimeError;
    let plugin = match err {
        RuntimeError::Control(ControlError::Remote { error, .. }) => Some(error),
        RuntimeError::Plugin { source, .. } => Some(source),
        _ => None,
    };
    if let Some(e) = plugin {
        let help = (!e.help.is_empty()).then(|| e.help.to_string());
        return (format!("{} [{}]", e.message, e.code.as_str()), help);
    }
    let text = err.to_string();
    let text = match text.strip_prefix(worker) {
        Some(rest) => rest.trim_start_matches(':').trim_start().to_owned(),
        None => text,
    };
    (text, err.help())
}
