//! The weight bridge a worker holds beside its component. The controller's bridge driver
//! installs it ([`BridgeCall::Install`]: the component from the worker's registry, with the
//! worker's services — memory, the transport group `bridge`, the run directory), then runs
//! its halves: the trainer half next to the trainer (on the trainer's thread), the engine
//! half next to the engine — through the level-7 calls (`ship`, `transmit`, `receive` into
//! the services' decoded-tensor sink, `after_apply`, `stats`), whose defaults adapt a
//! level-4 bridge's.
//!
//! A trainer exports a region's tensor layout with its first export of the region only. The
//! trainer worker keeps the last layout it saw and hands it to a bridge instance that has not
//! been given it (one installed after that first export, e.g. a bridge replaced mid-run), so
//! every bridge's trainer half sees the layout once, whenever it was installed.

use super::WorkerSpec;
use crate::registry::Registry;
use crate::services::Services;
use std::sync::{Arc, Mutex};
use tandem_control::protocol::{BridgeCall, BridgeReply};
use tandem_plugin_api::{
    ApplyOutcome, BridgeBox, EngineBox, PluginError, RVec, TensorSpec, TrainerBox, UpdatePayload,
    WeightUpdate,
};

/// What a worker needs to install a bridge, and the bridge it holds.
pub(crate) struct Bridges {
    registry: Registry,
    spec: WorkerSpec,
    services: Services,
    current: Mutex<Option<Arc<BridgeBox>>>,
    layouts: Mutex<Layouts>,
}

/// An `Install` answered, or the bridge a call runs on.
enum Held {
    Installed(BridgeReply),
    Bridge(Arc<BridgeBox>),
}

/// The trainer's last region layout, and whether the current bridge instance was given it.
#[derive(Default)]
struct Layouts {
    last: Option<(String, RVec<TensorSpec>)>,
    given: bool,
}

impl Layouts {
    /// Records a layout the trainer exported, or fills in the recorded one for a bridge
    /// instance that has not seen it.
    fn complete(&mut self, update: &mut WeightUpdate) {
        let UpdatePayload::SharedRegion { region, tensors } = &mut update.payload else {
            return;
        };
        let key = region.key.as_str();
        if !tensors.is_empty() {
            self.last = Some((key.to_owned(), tensors.clone()));
            self.given = true;
        } else if !self.given
            && let Some((k, t)) = &self.last
            && k == key
        {
            *tensors = t.clone();
            self.given = true;
        }
    }
}

impl Bridges {
    pub(super) fn new(registry: Registry, spec: WorkerSpec, services: Services) -> Bridges {
        Bridges {
            registry,
            spec,
            services,
            current: Mutex::new(None),
            layouts: Mutex::new(Layouts::default()),
        }
    }

    fn install(
        &self,
        component: &str,
        options_json: &str,
        engines: u32,
    ) -> Result<BridgeReply, PluginError> {
        let mut config = self.spec.component_config();
        config.component = component.into();
        config.options_json = options_json.into();
        config.world_size = engines;
        let bridge = self
            .registry
            .new_bridge(config, self.services.handle())
            .map_err(|e| match e {
                crate::error::RuntimeError::Plugin { source, .. } => source,
                other => PluginError::invalid_input(other.to_string()),
            })?;
        let plan = bridge.plan().into_result()?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(bridge));
        self.layouts.lock().unwrap_or_else(|p| p.into_inner()).given = false;
        Ok(BridgeReply::Installed(plan))
    }

    /// Answers an `Install` call, or the installed bridge for any other call.
    fn install_or_get(&self, call: &BridgeCall) -> Result<Held, PluginError> {
        if let BridgeCall::Install {
            component,
            options_json,
            engines,
        } = call
        {
            return self
                .install(component, options_json, *engines)
                .map(Held::Installed);
        }
        self.get(call).map(Held::Bridge)
    }

    fn get(&self, call: &BridgeCall) -> Result<Arc<BridgeBox>, PluginError> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.clone().ok_or_else(|| {
            PluginError::invalid_state(format!(
                "`{}` reached a worker with no weight bridge installed",
                call.name()
            ))
        })
    }
}

/// A bridge call in a trainer worker (on the trainer's thread: the export reads the trainer).
pub(super) fn on_trainer(
    call: BridgeCall,
    trainer: &mut TrainerBox,
    bridges: &Bridges,
) -> Result<BridgeReply, PluginError> {
    let bridge = match bridges.install_or_get(&call)? {
        Held::Installed(reply) => return Ok(reply),
        Held::Bridge(b) => b,
    };
    match call {
        BridgeCall::Export { kind } => {
            let mut exported = trainer.export_weight_update(kind).into_result()?;
            bridges
                .layouts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .complete(&mut exported);
            bridge
                .ship(exported)
                .into_result()
                .map(BridgeReply::Shipped)
        }
        BridgeCall::Send { shipped } => bridge
            .transmit(shipped)
            .into_result()
            .map(|()| BridgeReply::Sent),
        BridgeCall::AfterApply { outcome } => bridge
            .after_apply(outcome)
            .into_result()
            .map(|()| BridgeReply::Done),
        BridgeCall::Stats => stats(&bridge),
        call => Err(PluginError::invalid_input(format!(
            "trainer worker got `{}`, an engine's bridge call",
            call.name()
        ))),
    }
}

/// A bridge call in an engine worker.
pub(super) fn on_engine(
    call: BridgeCall,
    engine: &EngineBox,
    bridges: &Bridges,
) -> Result<BridgeReply, PluginError> {
    let bridge = match bridges.install_or_get(&call)? {
        Held::Installed(reply) => return Ok(reply),
        Held::Bridge(b) => b,
    };
    match call {
        BridgeCall::Apply { shipped } => {
            let version = shipped.version;
            let applied =
                tandem_services::decoded::receive(&bridge, engine, &bridges.services, shipped);
            let outcome = ApplyOutcome {
                version,
                applied: applied.is_ok(),
            };
            // The engine's outcome stands; a half that cannot take it is logged.
            if let Err(e) = bridge.after_apply(outcome).into_result() {
                tracing::warn!("the bridge's after_apply (v{version}) failed: {e}");
            }
            applied.map(BridgeReply::Applied)
        }
        BridgeCall::Stats => stats(&bridge),
        call => Err(PluginError::invalid_input(format!(
            "engine worker got `{}`, a trainer's bridge call",
            call.name()
        ))),
    }
}

fn stats(bridge: &BridgeBox) -> Result<BridgeReply, PluginError> {
    bridge
        .stats()
        .into_result()
        .map(|m| BridgeReply::Stats(m.into_vec()))
}
