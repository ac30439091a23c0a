//! The drafter sync and the speculation switch, after every step's weight sync (the engines
//! generate again): a drafter a bubble trained and exported is loaded by every engine
//! (`load_drafter`, which keeps the engine's previous drafter when a load fails); with
//! `min_acceptance`, a rollout whose measured acceptance length fell below it switches
//! speculation off (`load_drafter("")`), and it comes back on with the first drafter whose
//! training accuracies predict an acceptance length at or above it.

use super::{Draft, NAME};
use crate::events::EventLog;
use tandem_runtime::launch::RemoteEngine;

impl Draft {
    /// The step's drafter sync and switch (see the module doc); `measured` is the rollout's
    /// acceptance length when the engines speculated. Never fails the step: a failed load is
    /// an event, and the engines keep serving the drafter they had.
    pub(in crate::driver) fn sync(
        &mut self,
        step: u32,
        measured: Option<f64>,
        engines: &[RemoteEngine],
        events: &EventLog,
    ) {
        if self.off.is_some() {
            return;
        }
        let min = self.settings.min_acceptance;
        let mut switched_off = false;
        if min > 0.0
            && self.speculating
            && let Some(a) = measured
            && a < min
        {
            speculation_off(engines, step, events);
            events.record(
                step,
                NAME,
                "speculation",
                &format!("off: acceptance length {a:.2} < min_acceptance {min}"),
            );
            self.speculating = false;
            switched_off = true;
        }
        let Some((dir, version)) = self.exported.take() else {
            return;
        };
        let predicted = self.predicted.unwrap_or(0.0);
        if switched_off || (!self.speculating && min > 0.0 && predicted < min) {
            // Kept for the record: the next trained drafter is judged again.
            events.record(
                step,
                NAME,
                "skip_sync",
                &format!("version {version}: predicted acceptance length {predicted:.2}"),
            );
            return;
        }
        let mut failed = Vec::new();
        for (rank, e) in engines.iter().enumerate() {
            if let Err(err) = e.load_drafter(&dir) {
                failed.push(format!("engine-{rank}: {err}"));
            }
        }
        if failed.is_empty() {
            events.record(
                step,
                "engines",
                "load_drafter",
                &format!("version {version}"),
            );
            if !self.speculating {
                events.record(
                    step,
                    NAME,
                    "speculation",
                    &format!("on: predicted acceptance length {predicted:.2}"),
                );
            }
            self.served = version;
            self.speculating = true;
        } else {
            let why = failed.join("; ");
            tracing::warn!(
                "drafter sync of version {version} failed ({why}); engines keep their drafter"
            );
            events.record(step, NAME, "sync_failed", &why);
        }
    }
}

/// Every engine stops speculating (`load_drafter("")`); an engine that refuses is logged.
pub(super) fn speculation_off(engines: &[RemoteEngine], step: u32, events: &EventLog) {
    for (rank, e) in engines.iter().enumerate() {
        if let Err(err) = e.load_drafter("") {
            tracing::warn!("engine-{rank} could not stop speculating: {err}");
        }
    }
    events.record(step, "engines", "load_drafter", "off");
}
