//! The trainer as a PPO value model (`compute_values`, `train_step_value`): the core's value
//! head over the trainer's body ([`tandem_native_core::value_head`]), created zero on the
//! first value call and kept for the component's life (a restore or load that predates it
//! zeroes it: a fresh head). Checkpoints carry it in [`VALUE_HEAD_FILE`] (tensors `weight`
//! `[d]`, `bias` `[1]` and the AdamW moments `m`, `v` `[d + 1]`), and the state file says
//! `"value_head": true`, so a checkpoint that should hold a head and does not is an error.

use std::path::Path;

use tandem_native_core::st_io;
use tandem_native_core::trainer::Trainer;
use tandem_native_core::value::ValueTargets as CoreTargets;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{Metric, PluginError, RVec, TrainBatch, ValueTargets};

use super::{NativeTrainer, st_write};
use crate::batch::Padded;
use crate::common::Ctx;

/// The value head's file in a checkpoint directory.
pub const VALUE_HEAD_FILE: &str = "value_head.safetensors";

/// A checkpoint's value head, read and checked, not yet in the trainer:
/// `(params [w, b], m, v)`.
pub(super) type StagedHead = (Vec<f32>, Vec<f32>, Vec<f32>);

impl NativeTrainer {
    pub(super) fn values(&mut self, batch: &TrainBatch) -> Result<Vec<RVec<f32>>> {
        let (tr, p) = self.ready("compute_values")?;
        let pad = Padded::new(&batch.sequences, tr.model.cfg.vocab_size)?;
        tr.ensure_value_head(p).ctx("compute_values")?;
        let v = tr.values(&pad.batch(), p).ctx("compute_values")?;
        Ok(pad.completions(&v).into_iter().map(RVec::from).collect())
    }

    pub(super) fn train_value(
        &mut self,
        batch: &TrainBatch,
        targets: &ValueTargets,
    ) -> Result<Vec<Metric>> {
        let lc = &batch.loss;
        if !(lc.learning_rate > 0.0 && lc.learning_rate.is_finite()) {
            return Err(PluginError::invalid_input(format!(
                "train_step_value: learning_rate must be > 0 (got {})",
                lc.learning_rate
            )));
        }
        let c = targets.clip;
        if !(c >= 0.0 && c.is_finite()) {
            return Err(PluginError::invalid_input(format!(
                "train_step_value: the value clip must be finite and >= 0 (got {c})"
            )));
        }
        let (tr, p) = self.ready("train_step_value")?;
        let pad = Padded::new(&batch.sequences, tr.model.cfg.vocab_size)?;
        let returns = pad.scatter_rows(&targets.returns, "returns")?;
        let old = if c > 0.0 {
            Some(pad.scatter_rows(&targets.old_values, "old values (needed with a value clip)")?)
        } else {
            None
        };
        tr.opt.lr = lc.learning_rate;
        tr.max_grad_norm = (lc.grad_clip > 0.0).then_some(lc.grad_clip);
        let core = CoreTargets {
            returns: &returns,
            old_values: old.as_deref(),
            clip: c,
        };
        let (stats, step) = tr
            .train_step_value(&pad.batch(), &core, p)
            .ctx("train_step_value")?;
        if step.applied {
            self.version += 1;
        }
        Ok(vec![
            Metric::new("value_loss", stats.loss),
            Metric::new("value_clip_frac", stats.clip_frac),
            Metric::new("tokens", stats.tokens),
            Metric::new("grad_norm", step.grad_norm),
            Metric::new("applied", step.applied as u8 as f64),
            Metric::new("weight_version", self.version as f64),
        ])
    }
}

/// Writes the trainer's value head (if it has one) into `dir`; whether it did.
pub(super) fn save_head(tr: &Trainer, dir: &Path) -> Result<bool> {
    let Some(head) = &tr.value_head else {
        return Ok(false);
    };
    let (w, b) = head.params().split_at(head.hidden());
    let (m, v) = head.moments();
    let path = dir.join(VALUE_HEAD_FILE);
    st_write::write_flat(&path, &[("weight", w), ("bias", b), ("m", m), ("v", v)])
        .map_err(|e| PluginError::io(format!("writing {}: {e}", path.display())))?;
    Ok(true)
}

/// Reads the value head of the checkpoint `dir` (hidden size `d`): `None` when it has none;
/// an error when the file is missing although the state file says the checkpoint has one
/// (`expected`), or does not read as a head of this model.
pub(super) fn read_head(
    dir: &Path,
    d: usize,
    expected: bool,
    what: &str,
) -> Result<Option<StagedHead>> {
    let path = dir.join(VALUE_HEAD_FILE);
    if !path.exists() {
        if expected {
            return Err(PluginError::invalid_input(format!(
                "{what}: the checkpoint was written with a value head but has no \
                 {VALUE_HEAD_FILE}; restore the file or load another checkpoint"
            )));
        }
        return Ok(None);
    }
    let (mut w, mut b) = (vec![0f32; d], vec![0f32; 1]);
    let (mut m, mut v) = (vec![0f32; d + 1], vec![0f32; d + 1]);
    st_io::load_flat(
        &path,
        &mut [
            ("weight", &mut w),
            ("bias", &mut b),
            ("m", &mut m),
            ("v", &mut v),
        ],
    )
    .ctx(&format!("{what}: value head"))?;
    w.extend(b);
    Ok(Some((w, m, v)))
}

/// Puts a staged head into the trainer (creating its head if needed), or zeroes the
/// trainer's head when the checkpoint has none.
pub(super) fn apply_head(
    tr: &mut Trainer,
    staged: Option<StagedHead>,
    p: &mut dyn tandem_native_core::buffer::BufferProvider,
    what: &str,
) -> Result<()> {
    if staged.is_some() {
        tr.ensure_value_head(p).ctx(what)?;
    }
    if let Some(head) = tr.value_head.as_mut() {
        let (hp, _, hm, hv) = head.parts_mut();
        match staged {
            Some((w, m, v)) => {
                hp.copy_from_slice(&w);
                hm.copy_from_slice(&m);
                hv.copy_from_slice(&v);
            }
            None => {
                hp.fill(0.0);
                hm.fill(0.0);
                hv.fill(0.0);
            }
        }
    }
    Ok(())
}
