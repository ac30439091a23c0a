//! After a sync: the trainer half learns how it ended (`after_apply`; each engine half
//! learned its own in its worker), and the bridge's own figures are gathered from every
//! half (`stats`) for the sync's record.

use std::collections::BTreeMap;

use tandem_plugin_api::ApplyOutcome;
use tandem_runtime::launch::{RemoteEngine, RemoteTrainer};

/// Tells the trainer half whether the sync of `version` went through (every engine applied
/// and was verified). Its failure is logged: the sync's own outcome stands.
pub(super) fn conclude(trainer: &RemoteTrainer, version: u64, applied: bool) {
    if let Err(e) = trainer.bridge_after_apply(ApplyOutcome { version, applied }) {
        tracing::warn!("the bridge's trainer half did not take the outcome of v{version}: {e}");
    }
}

/// The bridge's figures since the last sync: the trainer half's by name, the engine halves'
/// summed as `engines.<name>`. A half that cannot answer is logged
/// and left out.
pub(super) fn stats(trainer: &RemoteTrainer, engines: &[RemoteEngine]) -> Vec<(String, f64)> {
    let mut out = BTreeMap::new();
    match trainer.bridge_stats() {
        Ok(metrics) => {
            for m in metrics {
                out.insert(m.name.to_string(), m.value);
            }
        }
        Err(e) => tracing::warn!("the bridge's trainer half gave no stats: {e}"),
    }
    for e in engines {
        match e.bridge_stats() {
            Ok(metrics) => {
                for m in metrics {
                    *out.entry(format!("engines.{}", m.name)).or_insert(0.0) += m.value;
                }
            }
            Err(err) => tracing::warn!("the bridge's half in {} gave no stats: {err}", e.name()),
        }
    }
    out.into_iter().collect()
}
