//! `ipc` (single copy): the trainer exports its weights region as a `SharedRegion` (region
//! key + tensor layout + version + digest); every engine checks the layout (one clear error
//! on a mismatch), maps the region and frees its own copy. A later sync is a fence + version
//! bump with a digest of the mapped memory: 0 bytes copied.
//!
//! The trainer ships the tensor layout with its first export of a region only; this module
//! keeps it for an engine that has not attached the region yet, and strips it from updates
//! of a region the engines already serve (they checked it when they attached it): shipping a
//! few hundred tensor specs through the control plane on every sync is what made an `ipc`
//! sync grow with the number of tensors.

use super::common::Common;
use super::{Mode, Shipment};
use crate::error::RlError;
use tandem_plugin_api::{RVec, TensorSpec, UpdatePayload, UpdateReport, WeightUpdate};
use tandem_runtime::launch::{RemoteEngine, RemoteTrainer};

/// The `ipc` mode's state.
#[derive(Default)]
pub(super) struct Ipc {
    /// The trainer region every engine serves in place (after the first apply).
    attached: Option<String>,
    /// A shared region's key and tensor layout as the trainer first exported it.
    layout: Option<(String, RVec<TensorSpec>)>,
}

impl Ipc {
    /// Applies `update` on every engine, with the layout they need.
    fn apply(
        &mut self,
        common: &Common,
        update: &WeightUpdate,
        engines: &[RemoteEngine],
    ) -> Result<Vec<UpdateReport>, RlError> {
        self.remember_layout(update);
        let shipped = self.with_layout(common.for_engines(update))?;
        common.apply_all(update, &shipped, engines)
    }

    /// Keeps the tensor layout a shared-region update carries.
    fn remember_layout(&mut self, update: &WeightUpdate) {
        if let UpdatePayload::SharedRegion { region, tensors } = &update.payload
            && !tensors.is_empty()
        {
            self.layout = Some((region.key.to_string(), tensors.clone()));
        }
    }

    /// The layout part of the update as engines get it: none for the region they serve, the
    /// remembered one for a region they have not attached.
    fn with_layout(&self, mut u: WeightUpdate) -> Result<WeightUpdate, RlError> {
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
                             layout, and this bridge never received it"
                        ))
                        .with_help(
                            "a trainer sends the layout with its first export of a region; set \
                             up the bridge with the trainer it syncs from",
                        ));
                    }
                }
            }
        }
        Ok(u)
    }
}

impl Mode for Ipc {
    fn ship(
        &mut self,
        common: &Common,
        shipment: Shipment<'_>,
    ) -> Result<Vec<UpdateReport>, RlError> {
        self.apply(common, shipment.update, shipment.engines)
    }

    /// The engines attach the trainer's region and serve it from now on.
    fn setup(
        &mut self,
        common: &mut Common,
        trainer: &RemoteTrainer,
        engines: &mut [RemoteEngine],
    ) -> Result<(), RlError> {
        let update = common.export(trainer)?;
        let reports = self.apply(common, &update, engines)?;
        common.check_reports(&update, &reports, engines)?;
        common.version = Some(update.version);
        tracing::info!(
            "ipc bridge: {} engine(s) serve the trainer's weights in place (v{}, {})",
            engines.len(),
            update.version,
            update.digest
        );
        Ok(())
    }

    fn shipped(&mut self, update: &WeightUpdate) {
        if let UpdatePayload::SharedRegion { region, .. } = &update.payload {
            self.attached = Some(region.key.to_string());
        }
    }

    fn keeps_weights_resident(&self) -> bool {
        true
    }
}
