//! `Trainer`: forward + loss + backward + AdamW over provider buffers.
//!
//! Buffers: `grads` (layout of the trainable parameters: base weights in full fine-tuning,
//! the adapter in LoRA mode), `optimizer` (m then v, same layout), `activations`
//! (grown through the provider when a larger batch arrives).

use std::path::Path;

use crate::acts::ActLayout;
use crate::backward::{Grads, backward};
use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::error::{NativeError, Result};
use crate::forward::forward;
use crate::lora::LoraAdapter;
use crate::loss::{Loss, LossStats, apply_loss};
use crate::model::Model;
use crate::optim::{AdamW, clip_grad_norm};
use crate::value_head::ValueHead;

mod critic;

/// A batch of `b` right-padded sequences of `t` tokens (token-aligned arrays, see
/// [`crate::loss`]).
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Token ids `[b·t]`.
    pub tokens: &'a [u32],
    /// Sequences.
    pub b: usize,
    /// Tokens per sequence.
    pub t: usize,
    /// Which target tokens count `[b·t]`.
    pub mask: &'a [f32],
}

/// Result of an optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// False when the norm was not finite and the update was skipped.
    pub applied: bool,
}

/// Trainer state over provider buffers.
pub struct Trainer {
    /// The model (weights buffer).
    pub model: Model,
    /// Adapter being trained (LoRA mode: base frozen), if any.
    pub lora: Option<LoraAdapter>,
    /// Optimizer hyper-parameters and step.
    pub opt: AdamW,
    /// Global-norm clip (None = off).
    pub max_grad_norm: Option<f32>,
    /// The value head when this trainer is a value model (see [`critic`]); its body is
    /// the model (or the adapter in LoRA mode).
    pub value_head: Option<ValueHead>,
    grads: Box<dyn Region>,
    m: Box<dyn Region>,
    v: Box<dyn Region>,
    acts: Option<Box<dyn Region>>,
    logprobs: Vec<f32>,
}

impl Trainer {
    /// Allocates gradient and optimizer buffers for the trainable parameters.
    pub fn new(
        model: Model,
        lora: Option<LoraAdapter>,
        opt: AdamW,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        if let Some(ad) = &lora {
            ad.check_for(&model.cfg)?;
        }
        let len = match &lora {
            Some(ad) => ad.layout.total_len(),
            None => model.layout.total_len(),
        };
        Ok(Trainer {
            grads: provider.alloc(BufferTag::Grads, "grads", len)?,
            m: provider.alloc(BufferTag::Optimizer, "optimizer/m", len)?,
            v: provider.alloc(BufferTag::Optimizer, "optimizer/v", len)?,
            model,
            lora,
            opt,
            max_grad_norm: Some(1.0),
            value_head: None,
            acts: None,
            logprobs: Vec::new(),
        })
    }

    /// The gradient buffer (trainable-parameter layout).
    pub fn grads(&self) -> &[f32] {
        self.grads.as_slice()
    }

    /// The AdamW moments `(m, v)` (trainable-parameter layout).
    pub fn moments(&self) -> (&[f32], &[f32]) {
        (self.m.as_slice(), self.v.as_slice())
    }

    /// The AdamW moments `(m, v)`, writable (a checkpoint's moments are loaded into them).
    pub fn moments_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        (self.m.as_mut_slice(), self.v.as_mut_slice())
    }

    /// Sets all gradients to zero.
    pub fn zero_grad(&mut self) {
        self.grads.as_mut_slice().fill(0.0);
    }

    fn ensure_acts(&mut self, al: &ActLayout, provider: &mut dyn BufferProvider) -> Result<()> {
        let need = al.total_len();
        if self.acts.as_ref().is_none_or(|a| a.len() < need) {
            self.acts = None; // release the old one first
            self.acts = Some(provider.alloc(BufferTag::Activations, "activations/train", need)?);
        }
        Ok(())
    }

    fn check_batch(&self, batch: &Batch<'_>) -> Result<()> {
        let n = batch.b * batch.t;
        if n == 0 || batch.tokens.len() != n || batch.mask.len() != n {
            return Err(NativeError::Input(format!(
                "batch {}x{} needs {n} tokens and mask entries, got {} and {}",
                batch.b,
                batch.t,
                batch.tokens.len(),
                batch.mask.len()
            )));
        }
        Ok(())
    }

    /// Checks `batch`, sizes the activations buffer for it and runs the forward pass that
    /// saves what backward needs. Shared by [`accumulate`](Self::accumulate) and
    /// [`logprobs`](Self::logprobs).
    fn forward_batch(
        &mut self,
        batch: &Batch<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<ActLayout> {
        self.forward_batch_with(batch, provider, true)
    }

    /// [`forward_batch`](Self::forward_batch), the logits only `with_logits`.
    fn forward_batch_with(
        &mut self,
        batch: &Batch<'_>,
        provider: &mut dyn BufferProvider,
        with_logits: bool,
    ) -> Result<ActLayout> {
        self.check_batch(batch)?;
        let al = ActLayout::new(
            &self.model.cfg,
            batch.b,
            batch.t,
            self.lora.as_ref().map(|l| &l.cfg),
        );
        self.ensure_acts(&al, provider)?;
        let acts = self
            .acts
            .as_mut()
            .map(|a| a.as_mut_slice())
            .unwrap_or_default();
        forward(
            &self.model,
            self.lora.as_ref(),
            batch.tokens,
            &al,
            acts,
            with_logits,
        )?;
        Ok(al)
    }

    /// Forward + loss + backward; gradients are ADDED to the grads buffer (call
    /// [`zero_grad`](Self::zero_grad) between steps). Returns loss statistics; the new
    /// per-token logprobs are available from [`last_logprobs`](Self::last_logprobs).
    pub fn accumulate(
        &mut self,
        batch: &Batch<'_>,
        loss: &Loss<'_>,
        normalizer: Option<f32>,
        provider: &mut dyn BufferProvider,
    ) -> Result<LossStats> {
        let al = self.forward_batch(batch, provider)?;
        let acts = self
            .acts
            .as_mut()
            .map(|a| a.as_mut_slice())
            .unwrap_or_default();
        let vocab = self.model.cfg.vocab_size;
        let lo = al.logits_offset();
        self.logprobs.resize(al.n, 0.0);
        let stats = apply_loss(
            &mut acts[lo..lo + al.n * vocab],
            vocab,
            batch.tokens,
            batch.t,
            batch.mask,
            loss,
            normalizer,
            &mut self.logprobs,
        )?;
        let grads = trainable_grads(self.grads.as_mut_slice(), self.lora.is_some());
        backward(
            &self.model,
            self.lora.as_ref(),
            batch.tokens,
            &al,
            acts,
            grads,
        )?;
        Ok(stats)
    }

    /// Forward only: per-token logprobs of `batch` under the current parameters
    /// (token-aligned, entry 0 of each row = 0). Use for reference / behaviour logprobs.
    /// Gradients are untouched.
    pub fn logprobs(
        &mut self,
        batch: &Batch<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<Vec<f32>> {
        let al = self.forward_batch(batch, provider)?;
        let acts = self
            .acts
            .as_mut()
            .map(|a| a.as_mut_slice())
            .unwrap_or_default();
        let vocab = self.model.cfg.vocab_size;
        let lo = al.logits_offset();
        let mut out = vec![0.0; al.n];
        let ones = vec![1.0; al.n];
        apply_loss(
            &mut acts[lo..lo + al.n * vocab],
            vocab,
            batch.tokens,
            batch.t,
            &ones,
            &Loss::Sft,
            None,
            &mut out,
        )?;
        Ok(out)
    }

    /// Per-token logprobs of the last [`accumulate`](Self::accumulate) (token-aligned).
    pub fn last_logprobs(&self) -> &[f32] {
        &self.logprobs
    }

    /// Clips (if configured) and applies AdamW to the trainable parameters.
    pub fn optimizer_step(&mut self) -> Result<StepStats> {
        let grads = self.grads.as_mut_slice();
        let grad_norm = match self.max_grad_norm {
            Some(c) => clip_grad_norm(grads, c),
            None => crate::optim::grad_norm(grads),
        };
        if !grad_norm.is_finite() {
            return Ok(StepStats {
                grad_norm,
                applied: false,
            });
        }
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
            grad_norm,
            applied: true,
        })
    }

    /// Writes the trainable parameters atomically into `dir`: a Hugging Face model directory
    /// (config.json + model.safetensors) in full fine-tuning, a PEFT adapter directory in LoRA
    /// mode. Files go to a sibling temp directory, are fsynced, then renamed over `dir`.
    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let name = dir.file_name().ok_or_else(|| {
            NativeError::Input(format!(
                "checkpoint path {} has no file name",
                dir.display()
            ))
        })?;
        let tmp = dir.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| NativeError::io(&tmp, e))?;
        }
        match &self.lora {
            Some(ad) => ad.save(&tmp)?,
            None => self.model.save(&tmp)?,
        }
        for entry in std::fs::read_dir(&tmp).map_err(|e| NativeError::io(&tmp, e))? {
            let path = entry.map_err(|e| NativeError::io(&tmp, e))?.path();
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| NativeError::io(&path, e))?;
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| NativeError::io(dir, e))?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| NativeError::io(dir, e))
    }

    /// `zero_grad` + `accumulate` + `optimizer_step`.
    pub fn train_step(
        &mut self,
        batch: &Batch<'_>,
        loss: &Loss<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<(LossStats, StepStats)> {
        self.zero_grad();
        let s = self.accumulate(batch, loss, None, provider)?;
        Ok((s, self.optimizer_step()?))
    }
}

/// The gradient destinations of the trainable parameters: the adapter's in LoRA mode (base
/// frozen), the base weights' otherwise.
fn trainable_grads(grads: &mut [f32], lora: bool) -> Grads<'_> {
    match lora {
        true => Grads {
            base: None,
            lora: Some(grads),
        },
        false => Grads {
            base: Some(grads),
            lora: None,
        },
    }
}
