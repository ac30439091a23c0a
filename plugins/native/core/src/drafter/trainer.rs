//! `DrafterTrainer`: EAGLE-3 training-time test (TTT) over provider buffers — gradients and
//! AdamW moments (`grads/drafter`, `optimizer/drafter_{m,v}`) over the trainable prefix of
//! the weights, and one `activations/drafter` buffer sized at construction for the largest
//! batch ([`TttConfig`]), so memory never grows after [`DrafterTrainer::warm_up`].

use std::path::Path;

use super::Drafter;
use super::backward::{backward_steps, grad_parts};
use super::forward::forward_steps;
use super::head::{Mode, STEP_DECAY, Scores, head_pass};
use super::plan::{Dims, Plan, acts_len, split};
use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::error::{NativeError, Result};
use crate::model::Model;
use crate::optim::{AdamW, clip_grad_norm, grad_norm};

/// One training sequence: tokens, the target's aux features and the loss-mask start.
#[derive(Debug, Clone, Copy)]
pub struct SeqFeatures<'a> {
    /// Token ids `x_0 … x_{T−1}` (target vocabulary).
    pub tokens: &'a [u32],
    /// `[T, 3·H_target]`: aux features `A_t` of each position (see [`super::aux_features`]).
    pub feats: &'a [f32],
    /// Labels at index `≥ prompt_len` are scored (the completion).
    pub prompt_len: usize,
}

/// TTT shape and capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TttConfig {
    /// Draft steps unrolled in training (`S`, e.g. 4..7).
    pub steps: usize,
    /// Most tokens of one batch (sum of the sequence lengths; each sequence also fits the
    /// drafter's RoPE table).
    pub max_tokens: usize,
}

/// Result of a training (or evaluation) step.
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterStepMetrics {
    /// `Σ_s 0.8^s · loss_per_step[s]`.
    pub loss: f64,
    /// Mean cross-entropy of each step over its scored rows with an in-vocabulary label.
    pub loss_per_step: Vec<f64>,
    /// Top-1 accuracy of each step (mapped to target ids) over its scored rows.
    pub acc_per_step: Vec<f64>,
    /// Gradient norm before clipping (0 when no gradient was computed).
    pub grad_norm: f64,
    /// Scored positions of step 0 (completion labels).
    pub tokens: usize,
    /// False when no update was applied (evaluation, or a non-finite gradient norm).
    pub applied: bool,
}

/// Trainer of a [`Drafter`].
pub struct DrafterTrainer {
    /// The drafter being trained.
    pub drafter: Drafter,
    /// Optimizer hyper-parameters and step count.
    pub opt: AdamW,
    ttt: TttConfig,
    grads: Box<dyn Region>,
    m: Box<dyn Region>,
    v: Box<dyn Region>,
    acts: Box<dyn Region>,
    plan: Plan,
    list: Vec<(u32, u32)>,
}

impl DrafterTrainer {
    /// Allocates gradients, moments (trainable prefix) and the activations for `ttt`.
    pub fn new(
        drafter: Drafter,
        ttt: TttConfig,
        opt: AdamW,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        if ttt.steps == 0 || ttt.max_tokens < 3 {
            return Err(NativeError::Input(format!(
                "TTT needs steps >= 1 and max_tokens >= 3, got {ttt:?}"
            )));
        }
        let len = drafter.trainable_len();
        let dims = Dims {
            r: ttt.steps * ttt.max_tokens,
            n: ttt.max_tokens,
            w: ttt.max_tokens + ttt.steps,
        };
        let acts_n = acts_len(&drafter.cfg, dims);
        Ok(DrafterTrainer {
            grads: provider.alloc(BufferTag::Grads, "grads/drafter", len)?,
            m: provider.alloc(BufferTag::Optimizer, "optimizer/drafter_m", len)?,
            v: provider.alloc(BufferTag::Optimizer, "optimizer/drafter_v", len)?,
            acts: provider.alloc(BufferTag::Activations, "activations/drafter", acts_n)?,
            drafter,
            opt,
            ttt,
            plan: Plan::default(),
            list: Vec::new(),
        })
    }

    /// Loads a drafter directory ([`Drafter::load`]) and builds a trainer for it.
    pub fn load(
        dir: &Path,
        target: Option<&Model>,
        ttt: TttConfig,
        opt: AdamW,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        let d = Drafter::load(dir, target, provider)?;
        Self::new(d, ttt, opt, provider)
    }

    /// Saves the drafter ([`Drafter::save`]: atomic, vLLM/SGLang layout). The optimizer
    /// state is not part of the checkpoint.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.drafter.save(dir)
    }

    /// The TTT shape and capacity.
    pub fn ttt(&self) -> TttConfig {
        self.ttt
    }

    /// Gradients of the trainable prefix (the weights layout up to the embedding).
    pub fn grads(&self) -> &[f32] {
        &self.grads.as_slice()[..self.drafter.trainable_len()]
    }

    /// Gives the drafter back (buffers of the trainer are dropped).
    pub fn into_drafter(self) -> Drafter {
        self.drafter
    }

    fn check(&self, batch: &[SeqFeatures<'_>]) -> Result<()> {
        let c = &self.drafter.cfg;
        if batch.is_empty() {
            return Err(NativeError::Input("empty drafter batch".into()));
        }
        let total: usize = batch.iter().map(|s| s.tokens.len()).sum();
        if total > self.ttt.max_tokens {
            return Err(NativeError::Input(format!(
                "drafter batch of {total} tokens exceeds max_tokens {}",
                self.ttt.max_tokens
            )));
        }
        for (i, s) in batch.iter().enumerate() {
            let t = s.tokens.len();
            if t > self.drafter.rope.max_pos() {
                return Err(NativeError::Input(format!(
                    "sequence {i}: {t} tokens exceed the drafter's {} positions",
                    self.drafter.rope.max_pos()
                )));
            }
            if t == 0 || s.feats.len() != t * c.feat_dim() || s.prompt_len > t {
                return Err(NativeError::Input(format!(
                    "sequence {i}: {t} tokens need {} feature floats (got {}) and prompt_len <= \
                     {t} (got {})",
                    t * c.feat_dim(),
                    s.feats.len(),
                    s.prompt_len
                )));
            }
            if let Some(x) = s.tokens.iter().find(|&&x| x as usize >= c.vocab_size) {
                return Err(NativeError::Input(format!(
                    "sequence {i}: token id {x} is out of range for vocab_size {}",
                    c.vocab_size
                )));
            }
        }
        Ok(())
    }

    /// Forward, head pass in `mode` and (training) backward over `batch`.
    fn run(&mut self, batch: &[SeqFeatures<'_>], train: bool) -> Result<Scores> {
        self.check(batch)?;
        let steps = self.ttt.steps;
        self.plan
            .build(batch.iter().map(|s| (s.tokens.len(), s.prompt_len)), steps);
        let plan = &self.plan;
        let dims = Dims {
            r: plan.r(),
            n: plan.max_step_rows(),
            w: plan.max_len() + steps,
        };
        let d = &self.drafter;
        let mut a = split(&d.cfg, dims, self.acts.as_mut_slice())?;
        forward_steps(d, batch, plan, &mut a, dims.w);
        if !train {
            return Ok(head_pass(
                d,
                batch,
                plan,
                &mut a,
                Mode::Eval,
                &mut self.list,
            ));
        }
        let mut gr = grad_parts(&d.offs, self.grads.as_mut_slice());
        let mode = Mode::Train(&mut *gr.lm_head, &mut *gr.norm);
        let sc = head_pass(d, batch, plan, &mut a, mode, &mut self.list);
        backward_steps(d, batch, plan, &mut a, &mut gr, dims.w);
        Ok(sc)
    }

    fn metrics(sc: &Scores, grad_norm: f64, applied: bool) -> DrafterStepMetrics {
        let per = |num: &[f64], den: &[usize]| -> Vec<f64> {
            num.iter()
                .zip(den)
                .map(|(&x, &n)| if n > 0 { x / n as f64 } else { 0.0 })
                .collect()
        };
        let loss_per_step = per(&sc.ce, &sc.ce_rows);
        let hits: Vec<f64> = sc.hits.iter().map(|&h| h as f64).collect();
        let loss = loss_per_step
            .iter()
            .enumerate()
            .map(|(s, l)| STEP_DECAY.powi(s as i32) * l)
            .sum();
        DrafterStepMetrics {
            loss,
            acc_per_step: per(&hits, &sc.rows),
            loss_per_step,
            grad_norm,
            tokens: sc.rows.first().copied().unwrap_or(0),
            applied,
        }
    }

    /// Loss and accuracy of `batch` under the current weights (no gradient).
    pub fn evaluate(&mut self, batch: &[SeqFeatures<'_>]) -> Result<DrafterStepMetrics> {
        let sc = self.run(batch, false)?;
        Ok(Self::metrics(&sc, 0.0, false))
    }

    /// Zeroes the gradients and computes them for `batch` (no update).
    pub fn compute_grads(&mut self, batch: &[SeqFeatures<'_>]) -> Result<DrafterStepMetrics> {
        self.grads.as_mut_slice().fill(0.0);
        let sc = self.run(batch, true)?;
        let norm = grad_norm(self.grads());
        Ok(Self::metrics(&sc, norm, false))
    }

    /// One step: gradients of `batch`, global-norm clipping at `grad_clip` (if any), AdamW at
    /// learning rate `lr` over the trainable parameters. A non-finite gradient norm skips
    /// the update (`applied: false`).
    pub fn train_step(
        &mut self,
        batch: &[SeqFeatures<'_>],
        lr: f32,
        grad_clip: Option<f32>,
    ) -> Result<DrafterStepMetrics> {
        self.grads.as_mut_slice().fill(0.0);
        let sc = self.run(batch, true)?;
        let len = self.drafter.trainable_len();
        let grads = &mut self.grads.as_mut_slice()[..len];
        let norm = match grad_clip {
            Some(c) => clip_grad_norm(grads, c),
            None => grad_norm(grads),
        };
        if !norm.is_finite() {
            return Ok(Self::metrics(&sc, norm, false));
        }
        self.opt.lr = lr;
        self.opt.update(
            &mut self.drafter.weights.as_mut_slice()[..len],
            &self.grads.as_slice()[..len],
            &mut self.m.as_mut_slice()[..len],
            &mut self.v.as_mut_slice()[..len],
        )?;
        Ok(Self::metrics(&sc, norm, true))
    }

    /// Draft logits `[k, draft_vocab]` of the TTT rows `(s, 0, t)` of the single sequence
    /// `seq`, for the steps `s = 0 .. k` whose row exists (forward only).
    pub fn step_logits(&mut self, seq: &SeqFeatures<'_>, t: usize) -> Result<Vec<f32>> {
        let batch = std::slice::from_ref(seq);
        self.check(batch)?;
        let steps = self.ttt.steps;
        self.plan
            .build(std::iter::once((seq.tokens.len(), seq.prompt_len)), steps);
        let plan = &self.plan;
        let rows: Vec<usize> = (0..steps).map_while(|s| plan.find(s, 0, t)).collect();
        let dims = Dims {
            r: plan.r(),
            n: plan.max_step_rows(),
            w: plan.max_len() + steps,
        };
        let d = &self.drafter;
        let mut a = split(&d.cfg, dims, self.acts.as_mut_slice())?;
        forward_steps(d, batch, plan, &mut a, dims.w);
        let mut out = Vec::with_capacity(rows.len() * d.cfg.draft_vocab_size);
        head_pass(
            d,
            batch,
            plan,
            &mut a,
            Mode::Capture(&rows, &mut out),
            &mut self.list,
        );
        Ok(out)
    }

    /// Runs one step's forward and backward at the largest batch (`max_tokens` tokens, in
    /// sequences as long as the RoPE table allows) so every buffer is touched at its peak,
    /// then leaves the weights and moments as they were: gradients are zeroed; at step 0
    /// (moments all zero) an AdamW pass at learning rate 0 with zero gradients writes the
    /// moments without changing them.
    pub fn warm_up(&mut self) -> Result<()> {
        let c = &self.drafter.cfg;
        let n = self.ttt.max_tokens;
        let tokens: Vec<u32> = (0..n).map(|i| (i % c.vocab_size) as u32).collect();
        let feats = vec![0.0f32; n * c.feat_dim()];
        let piece = n.min(self.drafter.rope.max_pos()).max(1);
        let fd = c.feat_dim();
        let batch: Vec<SeqFeatures<'_>> = tokens
            .chunks(piece)
            .zip(feats.chunks(piece * fd))
            .map(|(t, f)| SeqFeatures {
                tokens: t,
                feats: f,
                prompt_len: 0,
            })
            .collect();
        self.grads.as_mut_slice().fill(0.0);
        self.run(&batch, true)?;
        self.grads.as_mut_slice().fill(0.0);
        if self.opt.step == 0 {
            let mut opt = AdamW {
                lr: 0.0,
                ..self.opt
            };
            let len = self.drafter.trainable_len();
            opt.update(
                &mut self.drafter.weights.as_mut_slice()[..len],
                &self.grads.as_slice()[..len],
                &mut self.m.as_mut_slice()[..len],
                &mut self.v.as_mut_slice()[..len],
            )?;
        }
        Ok(())
    }
}
