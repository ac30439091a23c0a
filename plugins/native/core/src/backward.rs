//! Backward pass, hand-written for the decoder of [`crate::forward`]. Reads the activations
//! saved by the forward (and dlogits, written over the logits by a loss), accumulates into
//! the gradient buffers: `base` (same layout as the weights; `None` = base frozen) and
//! `lora` (same layout as the adapter). The softmax is recomputed from the saved log-sum-exp.

use std::ops::Range;

use crate::acts::ActLayout;
use crate::error::{NativeError, Result};
use crate::forward::{LoraOp, from_head_major, lora_op, to_head_major};
use crate::linalg::{Mat, bias_grad, gemm_into_t, gemm_rows, linear_dw, linear_dx};
use crate::lora::{LoraAdapter, Target};
use crate::model::Model;
use crate::ops::attention::{AttnShape, attention_backward};
use crate::ops::mlp::swiglu_backward;
use crate::ops::norm::rmsnorm_backward;

/// Gradient destinations (each accumulated into with `+=`).
pub struct Grads<'a> {
    /// Base-model gradients (weights layout), or `None` when the base is frozen.
    pub base: Option<&'a mut [f32]>,
    /// LoRA gradients (adapter layout), or `None` when no adapter is trained.
    pub lora: Option<&'a mut [f32]>,
}

/// LoRA operands of one projection in backward: (A/B/r/scale, A/B ranges, saved x·Aᵀ, scratch).
type LoraBwd<'a, 'b> = (
    LoraOp<'a>,
    Option<&'a (Range<usize>, Range<usize>)>,
    &'b [f32],
    &'b mut [f32],
);

fn sub<'a>(buf: &'a mut Option<&mut [f32]>, r: &Range<usize>) -> Option<&'a mut [f32]> {
    buf.as_deref_mut().map(|b| &mut b[r.clone()])
}

/// Backward of `y = x Wᵀ + b + s (x Aᵀ) Bᵀ`: `dx (+)= ∂/∂x`, plus weight/bias/LoRA grads.
#[allow(clippy::too_many_arguments)]
fn proj_bwd(
    dx: &mut [f32],
    acc: bool,
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    (m, k, n): (usize, usize, usize),
    grads: &mut Grads<'_>,
    w_range: &Range<usize>,
    b_range: &Option<Range<usize>>,
    lora: LoraBwd<'_, '_>,
) {
    linear_dx(dx, dy, w, m, k, n, acc);
    if let Some(dw) = sub(&mut grads.base, w_range) {
        linear_dw(dw, dy, x, m, k, n, 1.0);
    }
    if let (Some(r), Some(_)) = (b_range, grads.base.as_ref())
        && let Some(db) = sub(&mut grads.base, r)
    {
        bias_grad(db, dy);
    }
    let (op, ranges, xa, tmp) = lora;
    if let (Some((a, b, r, s)), Some((ra, rb))) = (op, ranges) {
        let tmp = &mut tmp[..m * r];
        if let Some(db) = sub(&mut grads.lora, rb) {
            gemm_rows(db, n, r, m, Mat::rm_t(dy, n), Mat::rm(xa, r), s, true);
        }
        // d(xA) = s · dy B
        gemm_rows(tmp, m, r, n, Mat::rm(dy, n), Mat::rm(b, r), s, false);
        if let Some(da) = sub(&mut grads.lora, ra) {
            // dA = tmpᵀ·x, computed as (xᵀ·tmp)ᵀ: the GEMM's long side is `k`, not `r`.
            gemm_into_t(da, k, k, r, m, Mat::rm_t(x, k), Mat::rm(tmp, r), 1.0, true);
        }
        gemm_rows(dx, m, k, r, Mat::rm(tmp, r), Mat::rm(a, k), 1.0, true);
    }
}

/// Backward over the batch laid out by `al`; dlogits must already be in the logits slot.
pub fn backward(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &mut [f32],
    mut grads: Grads<'_>,
) -> Result<()> {
    check(model, lora, tokens, al, acts, &grads)?;
    if al.head_rows.is_some() {
        return Err(NativeError::Input(
            "backward from dlogits needs the full logits (ActLayout::new); a training layout \
             goes through crate::head and backward_body"
                .into(),
        ));
    }
    let c = &model.cfg;
    let w = model.w();
    let (n, d) = (al.n, c.hidden_size);
    {
        let [_, fin, scratch] = al.sections(acts)?;
        let [_, _, hf, dlogits] = al.final_parts(fin)?;
        let [_, d2, ..] = al.scratch(scratch)?;
        let lm = model.offs.lm_head.clone();
        linear_dx(d2, dlogits, &w[lm.clone()], n, d, c.vocab_size, false);
        if let Some(g) = sub(&mut grads.base, &lm) {
            linear_dw(g, dlogits, hf, n, d, c.vocab_size, 1.0);
        }
    }
    body_backward(model, lora, tokens, al, acts, grads)
}

/// Backward of the body alone with the gradient of the final normed hidden states already in
/// place: the `dh` slot of [`ActLayout::head_parts`], where [`crate::head::head_loss`] writes
/// it (the trainer's path; no copy of `[N, d]`).
pub fn backward_body(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &mut [f32],
    grads: Grads<'_>,
) -> Result<()> {
    check(model, lora, tokens, al, acts, &grads)?;
    body_backward(model, lora, tokens, al, acts, grads)
}

/// Backward of the body alone (final norm, layers, embedding) from `dh`, the gradient of the
/// final normed hidden states `[N, d]` (what a head other than the lm_head, e.g.
/// [`crate::value_head`], feeds back); the lm_head is skipped and its gradient untouched.
pub fn backward_from_hidden(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &mut [f32],
    dh: &[f32],
    grads: Grads<'_>,
) -> Result<()> {
    check(model, lora, tokens, al, acts, &grads)?;
    let need = al.n * model.cfg.hidden_size;
    if dh.len() != need {
        return Err(NativeError::Input(format!(
            "hidden-state gradient has {} f32, this batch needs {need}",
            dh.len()
        )));
    }
    {
        let [_, _, scratch] = al.sections(acts)?;
        let [_, d2, ..] = al.scratch(scratch)?;
        d2.copy_from_slice(dh);
    }
    body_backward(model, lora, tokens, al, acts, grads)
}

fn check(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &[f32],
    grads: &Grads<'_>,
) -> Result<()> {
    crate::forward::check_inputs(model, tokens, al, acts)?;
    if al.shared {
        return Err(NativeError::Input(
            "backward needs a training activation layout (ActLayout::new), got an inference one"
                .into(),
        ));
    }
    if grads.lora.is_some() != lora.is_some() {
        return Err(NativeError::Input(
            "LoRA gradients given without an adapter (or vice versa)".into(),
        ));
    }
    Ok(())
}

/// The body's backward; the scratch slot `d2` holds the gradient of the final normed hidden
/// states.
fn body_backward(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &mut [f32],
    mut grads: Grads<'_>,
) -> Result<()> {
    let c = &model.cfg;
    let w = model.w();
    let d = c.hidden_size;
    let [layers, fin, scratch] = al.sections(acts)?;
    let per = al.per_layer();
    let [xf, rf, ..] = al.final_parts(fin)?;
    {
        let [dres, d2, ..] = al.scratch(scratch)?;
        let norm = model.offs.norm.clone();
        let dnorm = sub(&mut grads.base, &norm);
        rmsnorm_backward(dres, dnorm, d2, xf, &w[norm], rf, false);
    }
    for l in (0..c.num_hidden_layers).rev() {
        let cur = &mut layers[l * per..(l + 1) * per];
        layer_backward(model, lora, l, al, cur, scratch, &mut grads)?;
    }
    let emb = model.offs.embed.clone();
    if let Some(de) = sub(&mut grads.base, &emb) {
        let [dres, ..] = al.scratch(scratch)?;
        for (row, &tok) in dres.chunks_exact(d).zip(tokens) {
            let t = tok as usize;
            for (o, g) in de[t * d..(t + 1) * d].iter_mut().zip(row) {
                *o += g;
            }
        }
    }
    Ok(())
}

fn layer_backward(
    model: &Model,
    lora: Option<&LoraAdapter>,
    l: usize,
    al: &ActLayout,
    cur: &mut [f32],
    scratch: &mut [f32],
    grads: &mut Grads<'_>,
) -> Result<()> {
    let c = &model.cfg;
    let w = model.w();
    let o = &model.offs.layers[l];
    let n = al.n;
    let (h, kv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let [
        x_in,
        r1,
        h1,
        q,
        k,
        v,
        p,
        att,
        x_mid,
        r2,
        h2,
        g,
        u,
        a,
        lq,
        lk,
        lv,
        lo,
        lg,
        lu,
        ld,
    ] = al.layer(cur)?;
    let [dres, d2, tq, tk, tv, hq, hk, hv, f1, f2, f3, lr] = al.scratch(scratch)?;
    let lranges = |t: Target| lora.and_then(|ad| ad.offs[l][t as usize].as_ref());
    let lp = |t: Target| lora_op(lora, l, t);
    // Backward of projection `t` over the `n` rows (x·Aᵀ saved in `xa`).
    let mut pb = |grads: &mut Grads<'_>,
                  (dx, acc): (&mut [f32], bool),
                  dy: &[f32],
                  (x, xa): (&[f32], &[f32]),
                  t: Target| {
        let (wr, br) = o.proj(t);
        let (k, m) = t.dims(c);
        let lora = (lp(t), lranges(t), xa, &mut *lr);
        proj_bwd(
            dx,
            acc,
            dy,
            x,
            &w[wr.clone()],
            (n, k, m),
            grads,
            wr,
            br,
            lora,
        );
    };
    // MLP: next = x_mid + down(swiglu(gate(h2), up(h2)))
    pb(grads, (f3, false), dres, (a, ld), Target::Down);
    swiglu_backward(f1, f2, f3, g, u);
    pb(grads, (d2, false), f1, (h2, lg), Target::Gate);
    pb(grads, (d2, true), f2, (h2, lu), Target::Up);
    let eps_w = &w[o.ln2.clone()];
    rmsnorm_backward(
        dres,
        sub(&mut grads.base, &o.ln2),
        d2,
        x_mid,
        eps_w,
        r2,
        true,
    );
    // Attention: x_mid = x_in + o_proj(att)
    pb(grads, (tq, false), dres, (att, lo), Target::O);
    let dims_q = (al.b, al.t, h, hd);
    let dims_kv = (al.b, al.t, kv, hd);
    to_head_major(hq, tq, dims_q, None, 0);
    let shape = AttnShape {
        b: al.b,
        h,
        kv,
        t: al.t,
        hd,
    };
    attention_backward(tq, hk, hv, hq, q, k, v, p, shape);
    // Undo RoPE on dq (tq) and dk (hk), back to token-major: dq → hq, dk → tk, dv → tv.
    for (i, row) in tq.chunks_exact_mut(hd).enumerate() {
        model.rope.apply_backward(row, i % al.t);
    }
    for (i, row) in hk.chunks_exact_mut(hd).enumerate() {
        model.rope.apply_backward(row, i % al.t);
    }
    from_head_major(hq, tq, dims_q);
    from_head_major(tk, hk, dims_kv);
    from_head_major(tv, hv, dims_kv);
    pb(grads, (d2, false), hq, (h1, lq), Target::Q);
    pb(grads, (d2, true), tk, (h1, lk), Target::K);
    pb(grads, (d2, true), tv, (h1, lv), Target::V);
    rmsnorm_backward(
        dres,
        sub(&mut grads.base, &o.ln1),
        d2,
        x_in,
        &w[o.ln1.clone()],
        r1,
        true,
    );
    Ok(())
}
