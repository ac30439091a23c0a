//! The lm_head pass of a TTT batch: draft logits in chunks of rows, the EAGLE-3 loss and
//! accuracy, and (training) the gradient through lm_head and the final norm into `dy`.
//!
//! Loss: row `(s, b, t)` predicts `x_{t+s+2}`; it is scored when that label's index is
//! `≥ prompt_len` (the completion). Accuracy counts every scored row (a label outside the
//! draft vocabulary is a miss); the cross-entropy (hard label, over the draft vocabulary)
//! only rows whose label is in the draft vocabulary. The loss is
//! `Σ_s 0.8^s · mean_s(CE)`, each step's mean over the whole batch.

use super::plan::{Acts, HEAD_CHUNK, Plan};
use super::trainer::SeqFeatures;
use super::{Drafter, NOT_DRAFTED};
use crate::linalg::{linear, linear_dw, linear_dx};
use crate::ops::norm::rmsnorm_backward;
use crate::sampling::{argmax, log_sum_exp};

/// EAGLE-3's per-step loss decay.
pub(crate) const STEP_DECAY: f64 = 0.8;

/// What the pass does besides scoring.
pub(crate) enum Mode<'a> {
    /// Scores only.
    Eval,
    /// Scores, then gradients: `(d lm_head, d norm)` accumulated, `dy` written.
    Train(&'a mut [f32], &'a mut [f32]),
    /// Copies the logits of the listed global rows into the vector (no scoring).
    Capture(&'a [usize], &'a mut Vec<f32>),
}

/// Per-step sums of a pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scores {
    pub ce: Vec<f64>,
    pub ce_rows: Vec<usize>,
    pub hits: Vec<usize>,
    pub rows: Vec<usize>,
}

/// Label (target id) and its draft id of global row `(s, b, t)`, when scored.
fn label(
    d: &Drafter,
    seqs: &[SeqFeatures<'_>],
    plan: &Plan,
    s: usize,
    bt: (u32, u32),
) -> Option<(usize, u32)> {
    let (b, t) = (bt.0 as usize, bt.1 as usize);
    let j = t + s + 2;
    (j >= plan.prompt[b]).then(|| {
        let y = seqs[b].tokens[j] as usize;
        (y, d.target_to_draft(y))
    })
}

/// Runs the pass over the rows of `plan` (scored rows, or the captured ones); `list` is
/// reused scratch for the row list.
pub(crate) fn head_pass(
    d: &Drafter,
    seqs: &[SeqFeatures<'_>],
    plan: &Plan,
    a: &mut Acts<'_>,
    mut mode: Mode<'_>,
    list: &mut Vec<(u32, u32)>,
) -> Scores {
    let c = &d.cfg;
    let (h, vd) = (c.hidden_size, c.draft_vocab_size);
    let steps = plan.steps;
    let mut sc = Scores {
        ce: vec![0.0; steps],
        ce_rows: vec![0; steps],
        hits: vec![0; steps],
        rows: vec![0; steps],
    };
    // (global row, step) of every row this pass computes logits for.
    list.clear();
    if let Mode::Capture(rows, _) = &mode {
        for &r in rows.iter() {
            let s = plan.step_off.partition_point(|&o| o <= r) - 1;
            list.push((r as u32, s as u32));
        }
    } else {
        for s in 0..steps {
            for r in plan.step_off[s]..plan.step_off[s + 1] {
                if let Some((_, dl)) = label(d, seqs, plan, s, plan.rows[r]) {
                    list.push((r as u32, s as u32));
                    sc.rows[s] += 1;
                    sc.ce_rows[s] += usize::from(dl != NOT_DRAFTED);
                }
            }
        }
    }
    if let Mode::Train(..) = mode {
        a.dy[..plan.r() * h].fill(0.0);
    }
    let wts = d.w();
    let lm = &wts[d.offs.lm_head.clone()];
    let w_norm = &wts[d.offs.norm.clone()];
    for chunk in list.chunks(HEAD_CHUNK) {
        let cn = chunk.len();
        for (hb, &(r, _)) in a.hbuf.chunks_exact_mut(h).zip(chunk) {
            hb.copy_from_slice(&a.hf[r as usize * h..(r as usize + 1) * h]);
        }
        let (hbuf, logits) = (&a.hbuf[..cn * h], &mut a.logits[..cn * vd]);
        linear(logits, hbuf, lm, cn, h, vd, false);
        if let Mode::Capture(_, out) = &mut mode {
            out.extend_from_slice(logits);
            continue;
        }
        for (lg, &(r, s)) in logits.chunks_exact_mut(vd).zip(chunk) {
            let s = s as usize;
            let Some((y, dl)) = label(d, seqs, plan, s, plan.rows[r as usize]) else {
                continue;
            };
            sc.hits[s] += usize::from(d.draft_to_target(argmax(lg)) == y);
            let lse = log_sum_exp(lg);
            if dl != NOT_DRAFTED {
                sc.ce[s] += lse - f64::from(lg[dl as usize]);
            }
            if let Mode::Train(..) = mode {
                if dl == NOT_DRAFTED {
                    lg.fill(0.0);
                    continue;
                }
                let wgt = (STEP_DECAY.powi(s as i32) / sc.ce_rows[s] as f64) as f32;
                for x in lg.iter_mut() {
                    *x = ((f64::from(*x) - lse).exp() as f32) * wgt;
                }
                lg[dl as usize] -= wgt;
            }
        }
        if let Mode::Train(dlm, dnorm) = &mut mode {
            let dh = &mut a.dh[..cn * h];
            linear_dx(dh, logits, lm, cn, h, vd, false);
            linear_dw(dlm, logits, hbuf, cn, h, vd, 1.0);
            for (dhr, &(r, _)) in dh.chunks_exact(h).zip(chunk) {
                let r = r as usize;
                rmsnorm_backward(
                    &mut a.dy[r * h..(r + 1) * h],
                    Some(&mut **dnorm),
                    dhr,
                    &a.y[r * h..(r + 1) * h],
                    w_norm,
                    &a.rf[r..r + 1],
                    false,
                );
            }
        }
    }
    sc
}
