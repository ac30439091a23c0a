//! The LM head, log-softmax, loss and their backward over the positions that carry loss
//! only, in chunks of rows: the full `[tokens × vocabulary]` logits never exist.
//!
//! Row `r` of the final normed hidden states `[B·T, d]` predicts token `r + 1` of the same
//! sequence; it is a *loss row* when that token is counted (mask ≠ 0, not the first token of
//! its row). The loss rows are gathered `rows` at a time into a scratch of `rows · (V + d)`
//! f32 (their hidden states, then their logits), projected, scored through the same per-row
//! code as [`crate::loss::apply_loss`] (so the same loss and `∂L/∂logits`), and, when
//! training, the chunk's `∂L/∂h = dlogits · W` is scattered into `dh` (zero on every other
//! row) and `dlogits ᵀ · h` added to the head weight's gradient. Only the GEMMs' blocking and
//! the order of the head weight's sums differ from the full-logits path: equal within float
//! rounding. The sequence ratio (GSPO) needs a sequence's every logprob before any gradient,
//! so it first runs a forward-only pass over the chunks.

use rayon::prelude::*;

use crate::error::{NativeError, Result};
use crate::linalg::{linear, linear_dw, linear_dx};
use crate::loss::{Loss, LossStats, LossTerms};
use crate::model::Model;

/// Default memory budget of the head's chunk scratch (hidden rows + logits).
pub const HEAD_BUDGET_BYTES: usize = 64 << 20;

/// Rows per chunk for a vocabulary of `vocab`, hidden size `d` and a budget in bytes (≥ 1).
pub fn chunk_rows(vocab: usize, d: usize, budget_bytes: usize) -> usize {
    (budget_bytes / (4 * (vocab + d).max(1))).max(1)
}

/// f32 of the chunk scratch for `rows` rows.
pub fn scratch_len(vocab: usize, d: usize, rows: usize) -> usize {
    rows * (vocab + d)
}

/// The loss rows of a token-aligned `[B·T]` mask with rows of `t` tokens (ascending).
pub fn loss_rows(t: usize, mask: &[f32]) -> Vec<usize> {
    (1..mask.len())
        .filter(|&i| !i.is_multiple_of(t) && mask[i] != 0.0)
        .map(|i| i - 1)
        .collect()
}

/// Where a training pass puts its gradients.
pub struct HeadGrads<'g> {
    /// `∂L/∂h` `[B·T, d]`, overwritten (zero off the loss rows).
    pub dh: &'g mut [f32],
    /// The head weight's gradient `[V, d]`, accumulated into (`None`: frozen).
    pub weight: Option<&'g mut [f32]>,
}

/// The inputs of one pass over a batch of `B` sequences of `t` tokens.
#[derive(Clone, Copy)]
pub struct HeadBatch<'b, 'a> {
    /// Final normed hidden states `[B·T, d]`.
    pub hidden: &'b [f32],
    /// Token ids `[B·T]`.
    pub tokens: &'b [u32],
    /// Tokens per sequence.
    pub t: usize,
    /// Which target tokens count `[B·T]`.
    pub mask: &'b [f32],
    /// The loss and its per-token inputs.
    pub loss: &'b Loss<'a>,
    /// The whole step's normaliser (see [`crate::loss::apply_loss`]).
    pub normalizer: Option<f32>,
}

/// Runs the head and the loss over the loss rows of `batch`: the new logprobs of the counted
/// tokens go into `logprobs_out` (token-aligned; every other entry 0) and the statistics are
/// returned; with `grads`, the gradients too (without, the pass is forward-only).
pub fn head_loss(
    model: &Model,
    batch: &HeadBatch<'_, '_>,
    scratch: &mut [f32],
    mut grads: Option<HeadGrads<'_>>,
    logprobs_out: &mut [f32],
) -> Result<LossStats> {
    let (v, d) = (model.cfg.vocab_size, model.cfg.hidden_size);
    let n = batch.tokens.len();
    let mut terms = LossTerms::new(
        v,
        batch.tokens,
        batch.t,
        batch.mask,
        batch.loss,
        batch.normalizer,
    )?;
    if batch.hidden.len() < n * d
        || logprobs_out.len() != n
        || grads.as_ref().is_some_and(|g| {
            g.dh.len() < n * d || g.weight.as_ref().is_some_and(|w| w.len() != v * d)
        })
    {
        return Err(NativeError::Input(format!(
            "head inputs disagree: {n} tokens of hidden size {d} need {} hidden f32 (got {}) \
             and {n} logprob entries (got {})",
            n * d,
            batch.hidden.len(),
            logprobs_out.len()
        )));
    }
    let rows = loss_rows(batch.t, batch.mask);
    let cap = scratch.len() / (v + d);
    if cap == 0 && !rows.is_empty() {
        return Err(NativeError::Buffer(format!(
            "head scratch has {} f32, one row needs {}",
            scratch.len(),
            v + d
        )));
    }
    let (hbuf, lbuf) = scratch.split_at_mut(cap * d);
    let w = &model.w()[model.offs.lm_head.clone()];
    let hidden = batch.hidden;
    // Gathers the chunk's hidden rows and projects them: logits `[rows, V]`.
    let project = |hbuf: &mut [f32], lbuf: &mut [f32], chunk: &[usize]| {
        let m = chunk.len();
        for (dst, &r) in hbuf.chunks_exact_mut(d).zip(chunk) {
            dst.copy_from_slice(&hidden[r * d..(r + 1) * d]);
        }
        linear(&mut lbuf[..m * v], &hbuf[..m * d], w, m, d, v, false);
    };
    logprobs_out.fill(0.0);
    let train = grads.is_some();
    if train && terms.needs_all_logprobs() {
        for chunk in rows.chunks(cap.max(1)) {
            project(hbuf, lbuf, chunk);
            let lps: Vec<Option<f32>> = lbuf[..chunk.len() * v]
                .par_chunks_mut(v)
                .zip(chunk.par_iter())
                .map(|(lg, &r)| terms.row(lg, r, false).0)
                .collect();
            for (&r, lp) in chunk.iter().zip(lps) {
                logprobs_out[r + 1] = lp.unwrap_or(0.0);
            }
        }
        terms.set_logprobs(logprobs_out);
    }
    if let Some(g) = grads.as_mut() {
        g.dh[..n * d].fill(0.0);
    }
    let mut per_row = vec![[0f64; 5]; n];
    for chunk in rows.chunks(cap.max(1)) {
        let m = chunk.len();
        project(hbuf, lbuf, chunk);
        let out: Vec<(Option<f32>, [f64; 5])> = lbuf[..m * v]
            .par_chunks_mut(v)
            .zip(chunk.par_iter())
            .map(|(lg, &r)| terms.row(lg, r, train))
            .collect();
        for (&r, (lp, t5)) in chunk.iter().zip(out) {
            per_row[r] = t5;
            logprobs_out[r + 1] = lp.unwrap_or(0.0);
        }
        if let Some(g) = grads.as_mut() {
            let dlogits = &lbuf[..m * v];
            if let Some(gw) = g.weight.as_deref_mut() {
                linear_dw(gw, dlogits, &hbuf[..m * d], m, d, v, 1.0);
            }
            linear_dx(&mut hbuf[..m * d], dlogits, w, m, d, v, false);
            for (src, &r) in hbuf.chunks_exact(d).zip(chunk) {
                g.dh[r * d..(r + 1) * d].copy_from_slice(src);
            }
        }
    }
    Ok(terms.finish(&per_row))
}
