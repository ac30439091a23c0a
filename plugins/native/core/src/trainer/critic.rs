//! The trainer as a PPO value model: the decoder body (the model, or its adapter in LoRA
//! mode) under a scalar [`ValueHead`], valued and trained on the loss of [`crate::value`].
//! The forward skips the lm_head; the backward starts from the head's `∂L/∂h`
//! ([`backward_from_hidden`]). One optimizer step updates body and head with the same AdamW
//! settings and step, after a global-norm clip over both gradients together.

use super::{Batch, StepStats, Trainer, trainable_grads};
use crate::backward::backward_from_hidden;
use crate::buffer::BufferProvider;
use crate::error::{NativeError, Result};
use crate::optim::grad_norm;
use crate::value::{ValueStats, ValueTargets, value_loss};
use crate::value_head::ValueHead;

impl Trainer {
    /// Creates the zero value head if there is none yet (the first act as a value model).
    pub fn ensure_value_head(&mut self, provider: &mut dyn BufferProvider) -> Result<()> {
        if self.value_head.is_none() {
            self.value_head = Some(ValueHead::new(self.model.cfg.hidden_size, provider)?);
        }
        Ok(())
    }

    fn head(&self) -> Result<&ValueHead> {
        self.value_head.as_ref().ok_or_else(|| {
            NativeError::Input("this trainer has no value head (ensure_value_head first)".into())
        })
    }

    /// The forward of a value batch: token-aligned values (entry 0 of each row = 0).
    fn value_forward(
        &mut self,
        batch: &Batch<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<(crate::acts::ActLayout, Vec<f32>)> {
        self.head()?;
        let al = self.forward_batch(batch, provider)?;
        let d = self.model.cfg.hidden_size;
        let ho = al.hidden_offset();
        let acts = self.acts.as_ref().map(|a| a.as_slice()).unwrap_or_default();
        let pos = self.head()?.forward(&acts[ho..ho + al.n * d]);
        Ok((al, ValueHead::aligned(&pos, batch.t)))
    }

    /// Token-aligned values of `batch` (entry `j` values the state that emits token `j`;
    /// entry 0 of each row = 0). Gradients are untouched.
    pub fn values(
        &mut self,
        batch: &Batch<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<Vec<f32>> {
        Ok(self.value_forward(batch, provider)?.1)
    }

    /// Forward + value loss + backward; gradients are ADDED to the body's and the head's
    /// buffers (call [`zero_value_grad`](Self::zero_value_grad) between steps).
    pub fn accumulate_value(
        &mut self,
        batch: &Batch<'_>,
        targets: &ValueTargets<'_>,
        normalizer: Option<f32>,
        provider: &mut dyn BufferProvider,
    ) -> Result<ValueStats> {
        let (al, values) = self.value_forward(batch, provider)?;
        let mut dv = vec![0f32; al.n];
        let stats = value_loss(&values, batch.t, batch.mask, targets, normalizer, &mut dv)?;
        let d = self.model.cfg.hidden_size;
        let ho = al.hidden_offset();
        let acts = self
            .acts
            .as_mut()
            .map(|a| a.as_mut_slice())
            .unwrap_or_default();
        let mut dh = vec![0f32; al.n * d];
        let head = self.value_head.as_mut().ok_or_else(|| {
            NativeError::Input("this trainer has no value head (ensure_value_head first)".into())
        })?;
        head.backward(&acts[ho..ho + al.n * d], &dv, batch.t, &mut dh);
        let grads = trainable_grads(self.grads.as_mut_slice(), self.lora.is_some());
        backward_from_hidden(
            &self.model,
            self.lora.as_ref(),
            batch.tokens,
            &al,
            acts,
            &dh,
            grads,
        )?;
        Ok(stats)
    }

    /// Zeroes the body's and the head's gradients.
    pub fn zero_value_grad(&mut self) {
        self.zero_grad();
        if let Some(h) = self.value_head.as_mut() {
            h.grads_mut().fill(0.0);
        }
    }

    /// Clips body + head gradients by their joint norm (if configured) and applies AdamW to
    /// both (the same settings and step count).
    pub fn value_optimizer_step(&mut self) -> Result<StepStats> {
        let Some(head) = self.value_head.as_mut() else {
            return Err(NativeError::Input("this trainer has no value head".into()));
        };
        let (hp, hg, hm, hv) = head.parts_mut();
        let body = self.grads.as_mut_slice();
        let norm = (grad_norm(body).powi(2) + grad_norm(hg).powi(2)).sqrt();
        if !norm.is_finite() {
            return Ok(StepStats {
                grad_norm: norm,
                applied: false,
            });
        }
        if let Some(c) = self.max_grad_norm {
            let coef = c as f64 / (norm + 1e-6);
            if coef < 1.0 {
                let coef = coef as f32;
                body.iter_mut()
                    .chain(hg.iter_mut())
                    .for_each(|g| *g *= coef);
            }
        }
        let mut head_opt = self.opt;
        head_opt.update(hp, hg, hm, hv)?;
        let params = match &mut self.lora {
            Some(ad) => ad.weights.as_mut_slice(),
            None => self.model.weights.as_mut_slice(),
        };
        self.opt.update(
            params,
            self.grads.as_slice(),
            self.m.as_mut_slice(),
            self.v.as_mut_slice(),
        )?;
        Ok(StepStats {
            grad_norm: norm,
            applied: true,
        })
    }

    /// `zero_value_grad` + `accumulate_value` + `value_optimizer_step` (creating the head
    /// first if there is none).
    pub fn train_step_value(
        &mut self,
        batch: &Batch<'_>,
        targets: &ValueTargets<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<(ValueStats, StepStats)> {
        self.ensure_value_head(provider)?;
        self.zero_value_grad();
        let s = self.accumulate_value(batch, targets, None, provider)?;
        Ok((s, self.value_optimizer_step()?))
    }
}
