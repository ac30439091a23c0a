//! Trainer snapshots (host or in-plugin) and checkpoint save/load (HF dir or PEFT adapter dir,
//! plus `tandem_trainer_state.json` with the weight version and optimizer step).

use std::path::Path;

use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::ModelConfig;
use tandem_native_core::lora::LoraAdapter;
use tandem_native_core::st_io;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{CheckpointInfo, PluginError, RString};

use super::{NativeTrainer, SNAPSHOT_TAGS, STATE_FILE, Snap};
use crate::common::{Ctx, host_call};

impl NativeTrainer {
    pub(super) fn take_snapshot(&mut self, name: &str) -> Result<()> {
        let host = self.host_backed();
        let (tr, _) = self.ready("snapshot")?;
        let step = tr.opt.step;
        let params = if host {
            None
        } else {
            Some((
                tr.model.w().to_vec(),
                tr.lora.as_ref().map(|l| l.weights.as_slice().to_vec()),
            ))
        };
        if host {
            let tags = SNAPSHOT_TAGS.iter().map(|t| RString::from(*t)).collect();
            host_call(self.host.snapshot(name.into(), tags), "snapshot")?;
        }
        let version = self.version;
        self.snapshots.insert(
            name.to_string(),
            Snap {
                params,
                step,
                version,
            },
        );
        Ok(())
    }

    pub(super) fn restore_snapshot(&mut self, name: &str, meta: bool) -> Result<()> {
        let Some(snap) = self.snapshots.get(name) else {
            let known: Vec<&String> = self.snapshots.keys().collect();
            return Err(PluginError::invalid_input(format!(
                "restore: no snapshot named `{name}` (taken: {known:?})"
            )));
        };
        let (step, version) = (snap.step, snap.version);
        match &snap.params {
            None => host_call(self.host.restore(name.into()), "restore")?,
            Some((w, l)) => {
                let (w, l) = (w.clone(), l.clone());
                let (tr, _) = self.ready("restore")?;
                tr.model.copy_weights_from(&w).ctx("restore")?;
                if let (Some(ad), Some(l)) = (tr.lora.as_mut(), l) {
                    ad.weights.as_mut_slice().copy_from_slice(&l);
                }
            }
        }
        if meta {
            if let Some(tr) = self.trainer.as_mut() {
                tr.opt.step = step;
            }
            self.version = version;
        }
        Ok(())
    }

    pub(super) fn save(&mut self, dir: &Path) -> Result<CheckpointInfo> {
        let version = self.version;
        let (tr, _) = self.ready("save_checkpoint")?;
        tr.save_checkpoint(dir)
            .ctx(&format!("save_checkpoint {}", dir.display()))?;
        let state = serde_json::json!({"weight_version": version, "adam_step": tr.opt.step});
        let path = dir.join(STATE_FILE);
        std::fs::write(&path, state.to_string())
            .map_err(|e| PluginError::io(format!("writing {}: {e}", path.display())))?;
        Ok(CheckpointInfo {
            dir: dir.display().to_string().into(),
            weight_version: version,
            bytes: dir_bytes(dir),
        })
    }

    pub(super) fn load(&mut self, dir: &Path) -> Result<CheckpointInfo> {
        let what = format!("load_checkpoint {}", dir.display());
        let (tr, _) = self.ready("load_checkpoint")?;
        match tr.lora.as_mut() {
            Some(ad) => {
                let staged =
                    LoraAdapter::load(dir, &tr.model.cfg, &mut VecProvider::new()).ctx(&what)?;
                if staged.layout != ad.layout {
                    return Err(PluginError::invalid_input(format!(
                        "{what}: adapter (r={}, targets {:?}) differs from the one being trained \
                         (r={}, targets {:?})",
                        staged.cfg.r, staged.cfg.targets, ad.cfg.r, ad.cfg.targets
                    )));
                }
                ad.weights
                    .as_mut_slice()
                    .copy_from_slice(staged.weights.as_slice());
            }
            None => {
                let cfg = ModelConfig::from_dir(dir).ctx(&what)?;
                if cfg != tr.model.cfg {
                    return Err(PluginError::invalid_input(format!(
                        "{what}: config.json describes another architecture than the loaded model"
                    )));
                }
                let files = st_io::model_files(dir).ctx(&what)?;
                let mut staged = vec![0f32; tr.model.layout.total_len()];
                let tied = cfg.tie_word_embeddings;
                st_io::load_into(&files, &tr.model.layout, &mut staged, &|n| {
                    (!(tied && n == "lm_head.weight")).then(|| n.to_string())
                })
                .ctx(&what)?;
                tr.model.copy_weights_from(&staged).ctx(&what)?;
            }
        }
        if let Ok(text) = std::fs::read_to_string(dir.join(STATE_FILE))
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        {
            if let Some(s) = v.get("adam_step").and_then(|x| x.as_u64()) {
                tr.opt.step = s;
            }
            if let Some(w) = v.get("weight_version").and_then(|x| x.as_u64()) {
                self.version = w;
            }
        }
        Ok(CheckpointInfo {
            dir: dir.display().to_string().into(),
            weight_version: self.version,
            bytes: dir_bytes(dir),
        })
    }
}

/// The `weight_version` recorded in `<dir>/tandem_trainer_state.json`, if any.
pub fn saved_version(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(STATE_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("weight_version")?.as_u64()
}

pub(super) fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
