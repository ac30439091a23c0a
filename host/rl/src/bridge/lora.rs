//! `lora` (hot swap): the trainer writes a PEFT adapter atomically under
//! `<run_dir>/adapters/v<N>`; every engine loads it as `native-v<N>`, checks its digest,
//! switches to it between requests and unloads the previous one. No restart. After a sync,
//! generate requests name the new adapter ([`Mode::adapter`]).

use super::common::Common;
use super::{Mode, Shipment};
use crate::error::RlError;
use tandem_plugin_api::{UpdatePayload, UpdateReport, WeightUpdate};

/// The `lora` mode's state.
#[derive(Default)]
pub(super) struct Lora {
    /// The adapter the engines serve (after the first sync).
    adapter: Option<String>,
}

impl Mode for Lora {
    fn ship(
        &mut self,
        common: &Common,
        shipment: Shipment<'_>,
    ) -> Result<Vec<UpdateReport>, RlError> {
        let shipped = common.for_engines(shipment.update);
        common.apply_all(shipment.update, &shipped, shipment.engines)
    }

    fn shipped(&mut self, update: &WeightUpdate) {
        if let UpdatePayload::Adapter { name, .. } = &update.payload {
            self.adapter = Some(name.to_string());
        }
    }

    fn adapter(&self) -> Option<String> {
        self.adapter.clone()
    }
}
