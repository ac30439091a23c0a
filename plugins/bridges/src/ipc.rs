//! `ipc` (single copy): the trainer exports its weights region as a `SharedRegion`; every
//! engine checks the layout, maps the region and frees its own copy, then serves the
//! trainer's memory in place. A later sync is a fence + version bump: 0 bytes copied.
//!
//! The trainer ships the tensor layout with its first export of a region only (a few hundred
//! tensor specs through the control plane on every sync made a sync grow with the number of
//! tensors). The trainer half writes it to `<run_dir>/bridge/ipc/<region>.json` (temporary
//! name + rename), and the engine half of an engine that has not seen the region (one
//! started later) reads it from there; an engine that already serves the region gets the
//! update without it.
//!
//! Plan: `weights` stay resident on both sides (the engines read the trainer's memory), and
//! the host syncs once before the first rollout so the engines drop their own copy.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::passthrough::expect_kind;
use tandem_plugin_api::sdk::{BridgeImpl, Result};
use tandem_plugin_api::{
    BridgePlan, ComponentConfig, PluginError, RVec, TensorSpec, UpdateKind, UpdatePayload,
    WeightUpdate,
};

/// The `ipc` bridge, one instance per process.
pub(crate) struct Ipc {
    /// Where the trainer half leaves layouts for the engine halves.
    layouts: PathBuf,
    /// Engine half: the region this engine was last given with its layout.
    seen: Mutex<Option<String>>,
}

impl Ipc {
    pub(crate) fn new(config: &ComponentConfig) -> Ipc {
        let run_dir = match config.run_dir.as_str() {
            "" => std::env::temp_dir(),
            d => PathBuf::from(d),
        };
        Ipc {
            layouts: run_dir.join("bridge").join("ipc"),
            seen: Mutex::new(None),
        }
    }

    fn layout_file(&self, key: &str) -> PathBuf {
        let name: String = key
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        self.layouts.join(format!("{name}.json"))
    }

    fn write_layout(&self, key: &str, tensors: &RVec<TensorSpec>) -> Result<()> {
        let path = self.layout_file(key);
        let io = |e: std::io::Error, what: &Path| {
            PluginError::io(format!("ipc bridge: writing {}: {e}", what.display()))
        };
        std::fs::create_dir_all(&self.layouts).map_err(|e| io(e, &self.layouts))?;
        let text = serde_json::to_vec(tensors)
            .map_err(|e| PluginError::runtime(format!("ipc bridge: encoding a layout: {e}")))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(|e| io(e, &tmp))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(e, &path))
    }

    fn read_layout(&self, key: &str) -> Result<RVec<TensorSpec>> {
        let path = self.layout_file(key);
        let text = std::fs::read(&path).map_err(|e| {
            PluginError::invalid_state(format!(
                "ipc bridge: region {key} arrived without its tensor layout and {} cannot be \
                 read: {e}",
                path.display()
            ))
            .with_help("the trainer half writes it with its first export of the region")
        })?;
        serde_json::from_slice(&text).map_err(|e| {
            PluginError::new(
                tandem_plugin_api::ErrorCode::Corrupt,
                format!("ipc bridge: {}: {e}", path.display()),
            )
        })
    }
}

impl BridgeImpl for Ipc {
    fn trainer_side(&self, exported: WeightUpdate) -> Result<WeightUpdate> {
        let exported = expect_kind("ipc", UpdateKind::SharedRegion, exported, "trainer side")?;
        if let UpdatePayload::SharedRegion { region, tensors } = &exported.payload
            && !tensors.is_empty()
        {
            self.write_layout(region.key.as_str(), tensors)?;
        }
        Ok(exported)
    }

    fn engine_side(&self, shipped: WeightUpdate) -> Result<WeightUpdate> {
        let mut update = expect_kind("ipc", UpdateKind::SharedRegion, shipped, "engine side")?;
        if let UpdatePayload::SharedRegion { region, tensors } = &mut update.payload {
            let key = region.key.to_string();
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.as_deref() == Some(key.as_str()) {
                // The engine checked this layout when it attached the region.
                *tensors = RVec::new();
            } else {
                if tensors.is_empty() {
                    *tensors = self.read_layout(&key)?;
                }
                *seen = Some(key);
            }
        }
        Ok(update)
    }

    fn plan(&self) -> Result<BridgePlan> {
        Ok(BridgePlan {
            resident_tags: RVec::from(vec!["weights".into()]),
            sync_at_start: true,
            ..BridgePlan::default()
        })
    }
}
