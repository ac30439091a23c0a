//! Full-sequence forward pass (training and prefill): embedding → L × (RMSNorm, GQA
//! attention with RoPE, residual, RMSNorm, SwiGLU MLP, residual) → RMSNorm → lm_head.
//! Every tensor backward needs is written into the `activations` buffer ([`ActLayout`]).

use std::ops::Range;

use crate::acts::ActLayout;
use crate::error::{NativeError, Result};
use crate::linalg::{Mat, add_bias, gemm_rows, linear};
use crate::lora::{AbRange, LoraAdapter, Target};
use crate::model::Model;
use crate::ops::attention::{AttnShape, attention};
use crate::ops::mlp::swiglu;
use crate::ops::norm::rmsnorm;
use crate::ops::rope::RopeTable;

/// LoRA operands of one projection: `(A, B, r, scale)`.
pub(crate) type LoraOp<'a> = Option<(&'a [f32], &'a [f32], usize, f32)>;

/// The LoRA operands of projection `t` in `layer`, if adapted.
pub(crate) fn lora_op<'a>(lora: Option<&'a LoraAdapter>, layer: usize, t: Target) -> LoraOp<'a> {
    let ad = lora?;
    let (a, b): &AbRange = ad.offs[layer][t as usize].as_ref()?;
    let w = ad.weights.as_slice();
    Some((&w[a.clone()], &w[b.clone()], ad.cfg.r, ad.cfg.scale()))
}

/// `y = x Wᵀ (+ bias) (+ scale · (x Aᵀ) Bᵀ)`, saving `x Aᵀ` into `xa`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn proj(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    lora: LoraOp<'_>,
    xa: &mut [f32],
) {
    linear(y, x, w, m, k, n, false);
    if let Some(b) = bias {
        add_bias(y, b);
    }
    if let Some((a, bm, r, s)) = lora {
        gemm_rows(xa, m, r, k, Mat::rm(x, k), Mat::rm_t(a, k), 1.0, false);
        gemm_rows(y, m, n, r, Mat::rm(xa, r), Mat::rm_t(bm, r), s, true);
    }
}

/// Token-major `[B·T, heads·hd]` → head-major `[B, heads, T, hd]`, rotating by RoPE when
/// `rope` is given (position = index within the sequence + `pos0`).
pub(crate) fn to_head_major(
    dst: &mut [f32],
    src: &[f32],
    (b, t, heads, hd): (usize, usize, usize, usize),
    rope: Option<&RopeTable>,
    pos0: usize,
) {
    for bi in 0..b {
        for ti in 0..t {
            let row = &src[(bi * t + ti) * heads * hd..][..heads * hd];
            for h in 0..heads {
                let o = ((bi * heads + h) * t + ti) * hd;
                let d = &mut dst[o..o + hd];
                d.copy_from_slice(&row[h * hd..(h + 1) * hd]);
                if let Some(r) = rope {
                    r.apply(d, pos0 + ti);
                }
            }
        }
    }
}

/// Head-major `[B, heads, T, hd]` → token-major `[B·T, heads·hd]`.
pub(crate) fn from_head_major(
    dst: &mut [f32],
    src: &[f32],
    (b, t, heads, hd): (usize, usize, usize, usize),
) {
    for bi in 0..b {
        for h in 0..heads {
            for ti in 0..t {
                let s = ((bi * heads + h) * t + ti) * hd;
                let o = (bi * t + ti) * heads * hd + h * hd;
                dst[o..o + hd].copy_from_slice(&src[s..s + hd]);
            }
        }
    }
}

pub(crate) fn bias_of<'a>(w: &'a [f32], r: &Option<Range<usize>>) -> Option<&'a [f32]> {
    r.as_ref().map(|r| &w[r.clone()])
}

/// Checks the inputs of a forward over `al` and returns an error naming the problem.
pub(crate) fn check_inputs(
    model: &Model,
    tokens: &[u32],
    al: &ActLayout,
    acts: &[f32],
) -> Result<()> {
    if al.n == 0 || tokens.len() != al.n {
        return Err(NativeError::Input(format!(
            "batch of {} tokens given, layout expects {} sequences x {} tokens",
            tokens.len(),
            al.b,
            al.t
        )));
    }
    if al.t > model.rope.max_pos() {
        return Err(NativeError::Input(format!(
            "sequence length {} exceeds the supported {} positions",
            al.t,
            model.rope.max_pos()
        )));
    }
    if acts.len() < al.total_len() {
        return Err(NativeError::Buffer(format!(
            "activations buffer has {} f32, this batch needs {}",
            acts.len(),
            al.total_len()
        )));
    }
    model.check_tokens(tokens)
}

/// Forward over `B` right-padded sequences of `T` tokens; on return the activations buffer
/// holds everything [`crate::backward::backward`] needs and the logits `[N, vocab]` at
/// [`ActLayout::logits_offset`] (computed only when `with_logits`).
pub fn forward(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &mut [f32],
    with_logits: bool,
) -> Result<()> {
    forward_hooked(
        model,
        lora,
        tokens,
        al,
        acts,
        with_logits,
        &mut |_, _, _| Ok(()),
    )
}

/// Per-layer callback of [`forward_hooked`]: `(layer, k, v)` with the layer's post-RoPE keys
/// and values, head-major `[B, KV, T, hd]`.
pub type LayerHook<'a> = dyn FnMut(usize, &[f32], &[f32]) -> Result<()> + 'a;

/// [`forward`] calling `hook` after every layer (the engine copies K/V into its cache there).
/// With an inference layout ([`ActLayout::for_inference`]) one layer section is reused.
pub fn forward_hooked(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &mut [f32],
    with_logits: bool,
    hook: &mut LayerHook<'_>,
) -> Result<()> {
    forward_observed(
        model,
        lora,
        tokens,
        al,
        acts,
        with_logits,
        hook,
        &mut |_, _| Ok(()),
    )
}

/// Callback of [`forward_observed`] with the residual stream entering a layer: `(layer, x)`,
/// `x` token-major `[N, d]`; `layer == num_hidden_layers` is the final residual (before the
/// final norm).
pub type InputHook<'a> = dyn FnMut(usize, &[f32]) -> Result<()> + 'a;

/// [`forward_hooked`] that also calls `inputs` with each layer's input residual before the
/// layer runs, and once more with the final residual (the engine's aux features for a draft
/// model).
#[allow(clippy::too_many_arguments)]
pub fn forward_observed(
    model: &Model,
    lora: Option<&LoraAdapter>,
    tokens: &[u32],
    al: &ActLayout,
    acts: &mut [f32],
    with_logits: bool,
    hook: &mut LayerHook<'_>,
    inputs: &mut InputHook<'_>,
) -> Result<()> {
    check_inputs(model, tokens, al, acts)?;
    if with_logits && al.head_rows.is_some() {
        return Err(NativeError::Input(
            "a training layout (ActLayout::training) holds no full logits; run the chunked \
             head (crate::head) instead"
                .into(),
        ));
    }
    if with_logits && !al.has_logits() {
        return Err(NativeError::Input(
            "a prefill layout (ActLayout::for_prefill) holds no logits; use \
             ActLayout::for_inference to score"
                .into(),
        ));
    }
    let c = &model.cfg;
    let w = model.w();
    let (n, d) = (al.n, c.hidden_size);
    let [layers, fin, scratch] = al.sections(acts)?;
    let per = al.per_layer();
    // Embedding into layer 0's x_in (or the final section when there are no layers).
    {
        let x0 = if c.num_hidden_layers > 0 {
            &mut layers[..n * d]
        } else {
            &mut fin[..n * d]
        };
        let emb = &w[model.offs.embed.clone()];
        for (row, &tok) in x0.chunks_exact_mut(d).zip(tokens) {
            row.copy_from_slice(&emb[tok as usize * d..(tok as usize + 1) * d]);
        }
    }
    for l in 0..c.num_hidden_layers {
        if al.shared {
            let cur = &mut layers[..per];
            inputs(l, &cur[..n * d])?;
            layer_forward(model, lora, l, al, cur, &mut fin[..n * d], scratch)?;
            let parts = al.layer(cur)?;
            hook(l, parts[4], parts[5])?;
            if l + 1 < c.num_hidden_layers {
                cur[..n * d].copy_from_slice(&fin[..n * d]);
            }
            continue;
        }
        let (head, after) = layers.split_at_mut((l + 1) * per);
        let cur = &mut head[l * per..];
        inputs(l, &cur[..n * d])?;
        let next: &mut [f32] = if l + 1 < c.num_hidden_layers {
            &mut after[..n * d]
        } else {
            &mut fin[..n * d]
        };
        layer_forward(model, lora, l, al, cur, next, scratch)?;
        let parts = al.layer(cur)?;
        hook(l, parts[4], parts[5])?;
    }
    inputs(c.num_hidden_layers, &fin[..n * d])?;
    let [xf, rf, hf, logits] = al.final_parts(fin)?;
    rmsnorm(
        hf,
        rf,
        xf,
        &w[model.offs.norm.clone()],
        c.rms_norm_eps as f32,
    );
    if with_logits {
        linear(
            logits,
            hf,
            &w[model.offs.lm_head.clone()],
            n,
            d,
            c.vocab_size,
            false,
        );
    }
    Ok(())
}

fn layer_forward(
    model: &Model,
    lora: Option<&LoraAdapter>,
    l: usize,
    al: &ActLayout,
    cur: &mut [f32],
    next: &mut [f32],
    scratch: &mut [f32],
) -> Result<()> {
    let c = &model.cfg;
    let w = model.w();
    let o = &model.offs.layers[l];
    let n = al.n;
    let (h, kv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let eps = c.rms_norm_eps as f32;
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
    let [d1, _d2, tq, tk, tv, hq, _hk, _hv, _f1, _f2, _f3, _lr] = al.scratch(scratch)?;
    // Projection `t` of this layer over the `n` rows, x·Aᵀ saved in `xa`.
    let pj = |(y, xa): (&mut [f32], &mut [f32]), x: &[f32], t: Target| {
        let (wr, br) = o.proj(t);
        let (k, m) = t.dims(c);
        proj(
            y,
            x,
            &w[wr.clone()],
            bias_of(w, br),
            n,
            k,
            m,
            lora_op(lora, l, t),
            xa,
        );
    };
    rmsnorm(h1, r1, x_in, &w[o.ln1.clone()], eps);
    pj((tq, lq), h1, Target::Q);
    pj((tk, lk), h1, Target::K);
    pj((tv, lv), h1, Target::V);
    to_head_major(q, tq, (al.b, al.t, h, hd), Some(&model.rope), 0);
    to_head_major(k, tk, (al.b, al.t, kv, hd), Some(&model.rope), 0);
    to_head_major(v, tv, (al.b, al.t, kv, hd), None, 0);
    let shape = AttnShape {
        b: al.b,
        h,
        kv,
        t: al.t,
        hd,
    };
    attention(hq, p, q, k, v, shape);
    from_head_major(att, hq, (al.b, al.t, h, hd));
    pj((d1, lo), att, Target::O);
    for ((m, x), y) in x_mid.iter_mut().zip(x_in.iter()).zip(d1.iter()) {
        *m = x + y;
    }
    rmsnorm(h2, r2, x_mid, &w[o.ln2.clone()], eps);
    pj((g, lg), h2, Target::Gate);
    pj((u, lu), h2, Target::Up);
    swiglu(a, g, u);
    pj((d1, ld), a, Target::Down);
    for ((out, m), y) in next.iter_mut().zip(x_mid.iter()).zip(d1.iter()) {
        *out = m + y;
    }
    Ok(())
}
