//! `squeeze`: the bridge object the host drives. It holds each half's state behind its own
//! lock — the trainer half ([`Sender`]) in the trainer's process, the engine half
//! ([`Receiver`]) in each engine's — so that one instance holding both halves (as a test
//! may build) never blocks `transmit` on a `receive` running at the same time.

use std::sync::{Mutex, MutexGuard};

use crate::engine::Receiver;
use crate::options::Options;
use crate::trainer::Sender;
use tandem_plugin_api::sdk::{BridgeImpl, Result, Sink};
use tandem_plugin_api::{
    ApplyOutcome, BridgePlan, HostBox, Metric, Received, ResidentTags, Shipment, WeightUpdate,
};

/// The `squeeze` bridge, one instance per process.
pub(crate) struct Squeeze {
    host: HostBox,
    options: Options,
    sender: Mutex<Sender>,
    receiver: Mutex<Receiver>,
}

/// The guarded value, also after a panic elsewhere (the SDK turns panics into errors; the
/// state is then at worst a sync's frames, which the next sync rewrites).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Squeeze {
    pub(crate) fn new(host: HostBox, options: Options) -> Squeeze {
        Squeeze {
            host,
            options,
            sender: Mutex::new(Sender::default()),
            receiver: Mutex::new(Receiver::default()),
        }
    }
}

impl BridgeImpl for Squeeze {
    fn ship(&self, exported: WeightUpdate) -> Result<Shipment> {
        lock(&self.sender).ship(&self.host, &self.options, exported)
    }

    fn transmit(&self, shipment: Shipment) -> Result<()> {
        lock(&self.sender).transmit(&self.host, &shipment)
    }

    fn receive(&self, shipment: Shipment, sink: &mut Sink) -> Result<Received> {
        lock(&self.receiver).receive(&self.host, shipment, sink)
    }

    fn after_apply(&self, outcome: ApplyOutcome) -> Result<()> {
        let sent = lock(&self.sender).after_apply(&self.host, &outcome);
        let received = lock(&self.receiver).after_apply(&outcome);
        sent.and(received)
    }

    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan {
            transport: true,
            ..BridgePlan::default()
        })
    }

    /// Nothing resident: the trainer half reads the trainer's weights only inside `ship`
    /// (when they are in place to be exported), and the engines copy out of the sink.
    fn resident(&self) -> Result<ResidentTags> {
        Ok(ResidentTags::default())
    }

    fn stats(&self) -> Result<Vec<Metric>> {
        let mut out = lock(&self.sender).stats.take();
        out.extend(lock(&self.receiver).stats.take());
        Ok(out)
    }
}
