//! Trainer snapshots (host or in-plugin) and checkpoint save/load: an HF dir or PEFT adapter
//! dir, plus `tandem_trainer_state.json` (weight version and optimizer step) and
//! `optimizer.safetensors` (the AdamW moments, flat F32 tensors `m` and `v` over the trainable
//! parameters, full fine-tuning and LoRA alike), so that a run resumed from a checkpoint
//! trains bit for bit as it would have without the stop. A checkpoint without the optimizer
//! file (written before checkpoints carried it) loads with the moments zeroed, and one
//! warning. A full fine-tuning checkpoint also gets `model.safetensors.index.json`, so that
//! loaders that take every `*.safetensors` of an unindexed directory skip the optimizer file.
//! A trainer that has acted as a value model also writes its value head (`critic`).

use std::path::Path;

use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::ModelConfig;
use tandem_native_core::layout::ParamLayout;
use tandem_native_core::lora::LoraAdapter;
use tandem_native_core::st_io;
use tandem_native_core::trainer::Trainer;
use tandem_plugin_api::files::dir_bytes;
use tandem_plugin_api::files::state::{TrainerState, write_state};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{CheckpointInfo, LogLevel, PluginError, RString};

use super::{NativeTrainer, SNAPSHOT_TAGS, STATE_FILE, Snap, critic, st_write};
use crate::common::{Ctx, host_call, log};

/// File of a checkpoint with the AdamW moments (see the module doc).
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// The weights' index, written into full fine-tuning checkpoints ([`write_index`]).
const INDEX_FILE: &str = "model.safetensors.index.json";

impl NativeTrainer {
    pub(super) fn take_snapshot(&mut self, name: &str) -> Result<()> {
        let host = self.host_backed();
        let (tr, _) = self.ready("snapshot")?;
        let step = tr.opt.step;
        let has_head = tr.value_head.is_some();
        let head = match (&tr.value_head, host) {
            (Some(h), false) => Some(h.params().to_vec()),
            _ => None,
        };
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
                head: (has_head, head),
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
        let (had_head, head) = snap.head.clone();
        let host = snap.params.is_none();
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
        // The value head: back to its snapshot, or zero (fresh) when it postdates it. A host
        // snapshot restored its regions, moments included; an in-plugin one holds the
        // parameters only (the moments are not copied, as the body's).
        let (tr, p) = self.ready("restore")?;
        if let Some(h) = head {
            tr.ensure_value_head(p).ctx("restore")?;
            if let Some(vh) = tr.value_head.as_mut() {
                vh.params_mut().copy_from_slice(&h);
            }
        } else if !had_head && let Some(vh) = tr.value_head.as_mut() {
            let (hp, _, hm, hv) = vh.parts_mut();
            hp.fill(0.0);
            if host {
                hm.fill(0.0);
                hv.fill(0.0);
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
        let path = dir.join(OPTIMIZER_FILE);
        let (m, v) = tr.moments();
        st_write::write_flat(&path, &[("m", m), ("v", v)])
            .map_err(|e| PluginError::io(format!("writing {}: {e}", path.display())))?;
        if tr.lora.is_none() {
            write_index(dir, &tr.model.layout)?;
        }
        let head = critic::save_head(tr, dir)?;
        let mut state = TrainerState::new(version, tr.opt.step);
        state.extra.insert("value_head".into(), head.into());
        write_state(dir, &state)?;
        Ok(CheckpointInfo {
            dir: dir.display().to_string().into(),
            weight_version: version,
            bytes: dir_bytes(dir),
        })
    }

    /// Loads the checkpoint in `dir`: the parameters are staged and checked, then the moments
    /// are read (their file checked before any is), then the parameters copied in.
    pub(super) fn load(&mut self, dir: &Path) -> Result<CheckpointInfo> {
        let what = format!("load_checkpoint {}", dir.display());
        let (tr, p) = self.ready("load_checkpoint")?;
        let staged = Staged::read(tr, dir, &what)?;
        let state: Option<serde_json::Value> = std::fs::read_to_string(dir.join(STATE_FILE))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        let expected = state
            .as_ref()
            .and_then(|v| v.get("value_head")?.as_bool())
            .unwrap_or(false);
        let d = tr.model.cfg.hidden_size;
        let head = critic::read_head(dir, d, expected, &what)?;
        let opt_path = dir.join(OPTIMIZER_FILE);
        let moments = opt_path.exists();
        let (m, v) = tr.moments_mut();
        if moments {
            st_io::load_flat(&opt_path, &mut [("m", m), ("v", v)]).ctx(&what)?;
        } else {
            m.fill(0.0);
            v.fill(0.0);
        }
        match staged {
            Staged::Adapter(staged) => {
                if let Some(ad) = tr.lora.as_mut() {
                    ad.weights
                        .as_mut_slice()
                        .copy_from_slice(staged.weights.as_slice());
                }
            }
            Staged::Base(staged) => tr.model.copy_weights_from(&staged).ctx(&what)?,
        }
        critic::apply_head(tr, head, p, &what)?;
        if let Some(v) = state {
            if let Some(s) = v.get("adam_step").and_then(|x| x.as_u64()) {
                tr.opt.step = s;
            }
            if let Some(w) = v.get("weight_version").and_then(|x| x.as_u64()) {
                self.version = w;
            }
        }
        if !moments {
            let msg = format!(
                "{what}: no {OPTIMIZER_FILE} (a checkpoint written before checkpoints carried \
                 the AdamW moments): the moments start from zero"
            );
            log(&self.host, LogLevel::Warn, &msg);
        }
        Ok(CheckpointInfo {
            dir: dir.display().to_string().into(),
            weight_version: self.version,
            bytes: dir_bytes(dir),
        })
    }
}

/// The trainable parameters of a checkpoint, read and checked, not yet in the trainer.
enum Staged {
    /// LoRA mode: the adapter.
    Adapter(LoraAdapter),
    /// Full fine-tuning: the base weights in the model's layout.
    Base(Vec<f32>),
}

impl Staged {
    fn read(tr: &Trainer, dir: &Path, what: &str) -> Result<Staged> {
        match tr.lora.as_ref() {
            Some(ad) => {
                let staged =
                    LoraAdapter::load(dir, &tr.model.cfg, &mut VecProvider::new()).ctx(what)?;
                if staged.layout != ad.layout {
                    return Err(PluginError::invalid_input(format!(
                        "{what}: adapter (r={}, targets {:?}) differs from the one being trained \
                         (r={}, targets {:?})",
                        staged.cfg.r, staged.cfg.targets, ad.cfg.r, ad.cfg.targets
                    )));
                }
                Ok(Staged::Adapter(staged))
            }
            None => {
                let cfg = ModelConfig::from_dir(dir).ctx(what)?;
                if cfg != tr.model.cfg {
                    return Err(PluginError::invalid_input(format!(
                        "{what}: config.json describes another architecture than the loaded model"
                    )));
                }
                let files = st_io::model_files(dir).ctx(what)?;
                let mut staged = vec![0f32; tr.model.layout.total_len()];
                let tied = cfg.tie_word_embeddings;
                st_io::load_into(&files, &tr.model.layout, &mut staged, &|n| {
                    (!(tied && n == "lm_head.weight")).then(|| n.to_string())
                })
                .ctx(what)?;
                Ok(Staged::Base(staged))
            }
        }
    }
}

/// Writes `model.safetensors.index.json` naming `model.safetensors` for every weight of
/// `layout`: loaders that read every `*.safetensors` of a directory that has no index (vLLM,
/// SGLang) then read the weights alone, not the optimizer file beside them; loaders that look
/// for `model.safetensors` first (transformers, this plugin) read it as before.
fn write_index(dir: &Path, layout: &ParamLayout) -> Result<()> {
    let weight_map: serde_json::Map<String, serde_json::Value> = layout
        .entries()
        .iter()
        .map(|e| (e.name.clone(), "model.safetensors".into()))
        .collect();
    let index = serde_json::json!({
        "metadata": {"total_size": layout.num_params() * 4},
        "weight_map": weight_map,
    });
    let path = dir.join(INDEX_FILE);
    std::fs::write(&path, index.to_string())
        .map_err(|e| PluginError::io(format!("writing {}: {e}", path.display())))
}
