//! `Trainer`: forward + loss + backward + AdamW over provider buffers.
//!
//! Buffers: `grads` (layout of the trainable parameters: base weights in full fine-tuning,
//! the adapter in LoRA mode), `optimizer` (m then v, same layout), `activations` (one
//! micro-batch's: sized up front by [`Trainer::reserve_activations`], grown through the
//! provider when a larger micro-batch arrives). A step runs in micro-batches
//! ([`MicroBatch`]) with the whole batch's loss normaliser; the LM head and loss run over the
//! loss positions only, in chunks ([`crate::head`]): the full logits never exist.

use std::path::Path;

use crate::acts::ActLayout;
use crate::backward::{Grads, backward_body};
use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::error::{NativeError, Result};
use crate::forward::forward;
use crate::head::{self, HeadBatch, HeadGrads, head_loss};
use crate::lora::LoraAdapter;
use crate::loss::{Loss, LossStats, LossTerms, batch_normalizer};
use crate::model::Model;
use crate::optim::{AdamW, clip_grad_norm};
use crate::value_head::ValueHead;

mod critic;
mod micro;

pub use micro::MicroBatch;
use micro::StatSums;

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
    /// How a batch is split into micro-batches (default: one).
    pub micro_batch: MicroBatch,
    /// Memory budget of the LM head's chunk scratch, bytes ([`head::HEAD_BUDGET_BYTES`]).
    pub head_budget_bytes: usize,
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
            micro_batch: MicroBatch::default(),
            head_budget_bytes: head::HEAD_BUDGET_BYTES,
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

    /// Rows of the chunked head's scratch for a pass over `n` tokens.
    fn head_rows(&self, n: usize) -> usize {
        let c = &self.model.cfg;
        head::chunk_rows(c.vocab_size, c.hidden_size, self.head_budget_bytes).min(n.max(1))
    }

    /// The activations layout of a pass over `b` sequences of `t` tokens.
    fn layout(&self, b: usize, t: usize) -> ActLayout {
        let rows = self.head_rows(b * t);
        ActLayout::training(
            &self.model.cfg,
            b,
            t,
            self.lora.as_ref().map(|l| &l.cfg),
            rows,
        )
    }

    /// Allocates the activations buffer for micro-batches of up to `tokens` (padded) tokens
    /// now, so that memory is flat from the first step ([`MicroBatch::tokens`]; a longer
    /// sequence still grows it).
    pub fn reserve_activations(
        &mut self,
        tokens: usize,
        provider: &mut dyn BufferProvider,
    ) -> Result<()> {
        let al = self.layout(1, tokens.max(1));
        self.ensure_acts(&al, provider)
    }

    /// Checks `batch`, sizes the activations buffer for it and runs the body's forward pass
    /// that saves what backward needs (no logits: the head runs in [`pass`](Self::pass) or
    /// the value head's code).
    fn forward_batch(
        &mut self,
        batch: &Batch<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<ActLayout> {
        self.check_batch(batch)?;
        let al = self.layout(batch.b, batch.t);
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
            false,
        )?;
        Ok(al)
    }

    /// One pass over one micro-batch: forward, the chunked head + loss over the loss rows
    /// and, when `train`, the backward (gradients ADDED). Logprobs of the counted tokens go
    /// into `lp_out` (token-aligned, every other entry 0).
    fn pass(
        &mut self,
        batch: &Batch<'_>,
        loss: &Loss<'_>,
        normalizer: Option<f32>,
        train: bool,
        provider: &mut dyn BufferProvider,
        lp_out: &mut [f32],
    ) -> Result<LossStats> {
        let al = self.forward_batch(batch, provider)?;
        let acts = self
            .acts
            .as_mut()
            .map(|a| a.as_mut_slice())
            .unwrap_or_default();
        let lora = self.lora.is_some();
        let stats = {
            let (hidden, scratch, dh) = al.head_parts(acts)?;
            let hb = HeadBatch {
                hidden,
                tokens: batch.tokens,
                t: batch.t,
                mask: batch.mask,
                loss,
                normalizer,
            };
            let grads = train.then(|| HeadGrads {
                dh,
                weight: match lora {
                    true => None,
                    false => Some(&mut self.grads.as_mut_slice()[self.model.offs.lm_head.clone()]),
                },
            });
            head_loss(&self.model, &hb, scratch, grads, lp_out)?
        };
        if train {
            let grads = trainable_grads(self.grads.as_mut_slice(), lora);
            backward_body(
                &self.model,
                self.lora.as_ref(),
                batch.tokens,
                &al,
                acts,
                grads,
            )?;
        }
        Ok(stats)
    }

    /// Runs [`pass`](Self::pass) over the micro-batches of `batch` ([`MicroBatch`]; sequences
    /// whole, sorted by length, each micro-batch trimmed to its longest loss position), every
    /// one normalised by the whole batch's normaliser; the logprobs land in `lp_out`.
    fn passes(
        &mut self,
        batch: &Batch<'_>,
        loss: &Loss<'_>,
        normalizer: Option<f32>,
        train: bool,
        provider: &mut dyn BufferProvider,
        lp_out: &mut Vec<f32>,
    ) -> Result<LossStats> {
        self.check_batch(batch)?;
        // Checks the loss inputs over the whole batch (also when no sequence carries loss).
        LossTerms::new(
            self.model.cfg.vocab_size,
            batch.tokens,
            batch.t,
            batch.mask,
            loss,
            normalizer,
        )?;
        let z = normalizer.unwrap_or_else(|| batch_normalizer(loss, batch.t, batch.mask));
        lp_out.clear();
        lp_out.resize(batch.b * batch.t, 0.0);
        let mut sums = StatSums::default();
        for mb in micro::plan(batch, &self.micro_batch) {
            let part = mb.part(batch, loss);
            let sub = part.batch();
            let mut lp = vec![0f32; sub.b * sub.t];
            let s = self.pass(&sub, &part.loss(loss), Some(z), train, provider, &mut lp)?;
            mb.scatter(&lp, batch.t, lp_out);
            sums.add(&s);
        }
        Ok(sums.stats())
    }

    /// Forward + loss + backward; gradients are ADDED to the grads buffer (call
    /// [`zero_grad`](Self::zero_grad) between steps). The batch runs in micro-batches
    /// ([`micro_batch`](Self::micro_batch)) normalised by `normalizer` (`None`: this batch's
    /// own, [`batch_normalizer`]), so the result does not depend on their size beyond float
    /// rounding. Returns loss statistics; the new logprobs of the counted tokens are
    /// available from [`last_logprobs`](Self::last_logprobs).
    pub fn accumulate(
        &mut self,
        batch: &Batch<'_>,
        loss: &Loss<'_>,
        normalizer: Option<f32>,
        provider: &mut dyn BufferProvider,
    ) -> Result<LossStats> {
        let mut lp = std::mem::take(&mut self.logprobs);
        let out = self.passes(batch, loss, normalizer, true, provider, &mut lp);
        self.logprobs = lp;
        out
    }

    /// Forward only: the logprobs of the counted tokens of `batch` (mask ≠ 0) under the
    /// current parameters, token-aligned, every other entry 0 (the head runs over those
    /// positions only). Use for reference / behaviour logprobs. Gradients are untouched.
    pub fn logprobs(
        &mut self,
        batch: &Batch<'_>,
        provider: &mut dyn BufferProvider,
    ) -> Result<Vec<f32>> {
        let mut lp = Vec::new();
        self.passes(batch, &Loss::Sft, None, false, provider, &mut lp)?;
        Ok(lp)
    }

    /// Logprobs of the counted tokens of the last [`accumulate`](Self::accumulate)
    /// (token-aligned, every other entry 0).
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
