//! `lora` and `checkpoint`: bridges whose update kind both native halves already speak, so
//! the update travels as the trainer exported it. The trainer writes the adapter or the
//! checkpoint atomically (staging dir + rename) and the engine loads it; what the bridge adds
//! is the kind check on both sides and, for `checkpoint`, the choice between restarting the
//! engines on it (the host owns processes, so its plan asks the host to) and a reload in
//! place.

use tandem_plugin_api::sdk::{BridgeImpl, Result};
use tandem_plugin_api::{BridgePlan, PluginError, UpdateKind, WeightUpdate};

/// A bridge that ships the trainer's update unchanged.
pub(crate) struct Passthrough {
    name: &'static str,
    kind: UpdateKind,
    restart: bool,
}

impl Passthrough {
    pub(crate) fn lora() -> Passthrough {
        Passthrough {
            name: "lora",
            kind: UpdateKind::Adapter,
            restart: false,
        }
    }

    pub(crate) fn checkpoint(restart: bool) -> Passthrough {
        Passthrough {
            name: "checkpoint",
            kind: UpdateKind::CheckpointDir,
            restart,
        }
    }

    fn expect(&self, update: WeightUpdate, side: &str) -> Result<WeightUpdate> {
        expect_kind(self.name, self.kind, update, side)
    }
}

/// `update` if it is of `kind`, else one error naming the bridge and the side.
pub(crate) fn expect_kind(
    bridge: &str,
    kind: UpdateKind,
    update: WeightUpdate,
    side: &str,
) -> Result<WeightUpdate> {
    let got = update.payload.kind();
    if got == kind {
        Ok(update)
    } else {
        Err(PluginError::invalid_input(format!(
            "{bridge} bridge ({side}): got a `{}` update, it carries `{}`",
            got.as_str(),
            kind.as_str()
        ))
        .with_help("the trainer must export, and the engine accept, the bridge's declared kinds"))
    }
}

impl BridgeImpl for Passthrough {
    fn trainer_side(&self, exported: WeightUpdate) -> Result<WeightUpdate> {
        self.expect(exported, "trainer side")
    }

    fn engine_side(&self, shipped: WeightUpdate) -> Result<WeightUpdate> {
        self.expect(shipped, "engine side")
    }

    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan {
            restart_engines: self.restart,
            ..BridgePlan::default()
        })
    }
}
