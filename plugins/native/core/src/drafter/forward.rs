//! TTT forward of the drafter over a batch, step by step, saving what backward needs.
//!
//! Row `(s, b, t)` ([`super::plan`]): hidden input `g = fc(A_t)` at step 0, else the
//! midlayer output of `(s−1, b, t)`; token `x_{t+s+1}`; then
//! `xcat = [input_layernorm(embed) ‖ hidden_norm(g)]`, q/k/v from `xcat` (RoPE at `t + s`),
//! TTT attention, `m = g + o_proj(att)`, `y = m + down(silu(gate(h2)) ⊙ up(h2))` with
//! `h2 = post_attention_layernorm(m)`, and `hf = norm(y)` for the lm_head.

use super::Drafter;
use super::attn::{self, Geom};
use super::plan::{Acts, Plan};
use super::trainer::SeqFeatures;
use crate::linalg::linear;
use crate::ops::mlp::swiglu;
use crate::ops::norm::rmsnorm;

/// RMSNorm of each `h`-wide row of `x` into `dst` at `dst[i · stride + off ..][..h]`,
/// writing each row's inverse RMS into `rstd`.
pub(crate) fn norm_into(
    dst: &mut [f32],
    (stride, off): (usize, usize),
    x: &[f32],
    w: &[f32],
    eps: f32,
    rstd: &mut [f32],
) {
    let h = w.len();
    for ((xr, r), dr) in x
        .chunks_exact(h)
        .zip(rstd.iter_mut())
        .zip(dst.chunks_mut(stride))
    {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        *r = inv;
        for ((o, xv), wv) in dr[off..off + h].iter_mut().zip(xr).zip(w) {
            *o = wv * (xv * inv);
        }
    }
}

/// Copies `n` token-major rows `[n, heads·hd]` of `src` into head-major `dst`
/// (`[heads][stride][hd]`, row `i` at `row0 + i`), rotating by RoPE at `pos(i)` when given.
pub(crate) fn scatter_heads(
    dst: &mut [f32],
    src: &[f32],
    (heads, hd, stride, row0): (usize, usize, usize, usize),
    rope: Option<(&crate::ops::rope::RopeTable, &dyn Fn(usize) -> usize)>,
) {
    let n = src.len() / (heads * hd);
    for i in 0..n {
        for h in 0..heads {
            let d = &mut dst[(h * stride + row0 + i) * hd..][..hd];
            d.copy_from_slice(&src[(i * heads + h) * hd..][..hd]);
            if let Some((r, pos)) = rope {
                r.apply(d, pos(i));
            }
        }
    }
}

/// The midlayer forward of every step (see the module doc); `w` is the attention score row
/// width of the scratch.
pub(crate) fn forward_steps(
    d: &Drafter,
    seqs: &[SeqFeatures<'_>],
    plan: &Plan,
    a: &mut Acts<'_>,
    w: usize,
) {
    let c = &d.cfg;
    let (wts, o) = (d.w(), &d.offs);
    let (h, qd, kvd, ff, fd) = (
        c.hidden_size,
        c.q_dim(),
        c.kv_dim(),
        c.intermediate_size,
        c.feat_dim(),
    );
    let (nh, kv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let eps = c.rms_norm_eps as f32;
    let r = plan.r();
    let emb = &wts[o.embed.clone()];
    for s in 0..plan.steps {
        let (r0, r1) = (plan.step_off[s], plan.step_off[s + 1]);
        let n = r1 - r0;
        if n == 0 {
            continue;
        }
        let rows = &plan.rows[r0..r1];
        if s == 0 {
            for (b, sq) in seqs.iter().enumerate() {
                let (nb, off) = (plan.n(0, b), r0 + plan.seq_off(0, b));
                let g = &mut a.g[off * h..(off + nb) * h];
                linear(
                    g,
                    &sq.feats[..nb * fd],
                    &wts[o.fc.clone()],
                    nb,
                    fd,
                    h,
                    false,
                );
            }
        } else {
            for (i, &(b, t)) in rows.iter().enumerate() {
                let src = plan.row(s - 1, b as usize, t as usize);
                a.g[(r0 + i) * h..(r0 + i + 1) * h].copy_from_slice(&a.y[src * h..(src + 1) * h]);
            }
        }
        for (er, &(b, t)) in a.e.chunks_exact_mut(h).zip(rows) {
            let tok = seqs[b as usize].tokens[t as usize + s + 1] as usize;
            er.copy_from_slice(&emb[tok * h..(tok + 1) * h]);
        }
        let xcat = &mut a.xcat[r0 * 2 * h..r1 * 2 * h];
        let (w_in, w_hn) = (&wts[o.ln_in.clone()], &wts[o.ln_hidden.clone()]);
        norm_into(
            xcat,
            (2 * h, 0),
            &a.e[..n * h],
            w_in,
            eps,
            &mut a.re[r0..r1],
        );
        let g = &a.g[r0 * h..r1 * h];
        norm_into(xcat, (2 * h, h), g, w_hn, eps, &mut a.rg[r0..r1]);
        let xcat = &a.xcat[r0 * 2 * h..r1 * 2 * h];
        linear(
            &mut a.tq[..n * qd],
            xcat,
            &wts[o.q.clone()],
            n,
            2 * h,
            qd,
            false,
        );
        linear(
            &mut a.tk[..n * kvd],
            xcat,
            &wts[o.k.clone()],
            n,
            2 * h,
            kvd,
            false,
        );
        linear(
            &mut a.tv[..n * kvd],
            xcat,
            &wts[o.v.clone()],
            n,
            2 * h,
            kvd,
            false,
        );
        let pos = |i: usize| rows[i].1 as usize + s;
        let rope = Some((&d.rope, &pos as &dyn Fn(usize) -> usize));
        let q = &mut a.q[r0 * qd..r1 * qd];
        scatter_heads(q, &a.tq[..n * qd], (nh, hd, n, 0), rope);
        scatter_heads(a.k, &a.tk[..n * kvd], (kv, hd, r, r0), rope);
        scatter_heads(a.v, &a.tv[..n * kvd], (kv, hd, r, r0), None);
        let geom = Geom {
            plan,
            s,
            nh,
            kv,
            hd,
            w,
        };
        let lse = &mut a.lse[r0 * nh..r1 * nh];
        let q = &a.q[r0 * qd..r1 * qd];
        attn::forward(&mut a.hq[..n * qd], lse, q, a.k, a.v, a.sc, geom);
        let att = &mut a.att[r0 * qd..r1 * qd];
        for i in 0..n {
            for hh in 0..nh {
                att[i * qd + hh * hd..][..hd].copy_from_slice(&a.hq[(hh * n + i) * hd..][..hd]);
            }
        }
        let d1 = &mut a.d1[..n * h];
        linear(
            d1,
            &a.att[r0 * qd..r1 * qd],
            &wts[o.o.clone()],
            n,
            qd,
            h,
            false,
        );
        let m = &mut a.m[r0 * h..r1 * h];
        for ((mv, gv), dv) in m.iter_mut().zip(&a.g[r0 * h..r1 * h]).zip(d1.iter()) {
            *mv = gv + dv;
        }
        let h2 = &mut a.h2[r0 * h..r1 * h];
        rmsnorm(h2, &mut a.r2[r0..r1], m, &wts[o.ln_post.clone()], eps);
        let (gate, up) = (&mut a.gate[r0 * ff..r1 * ff], &mut a.up[r0 * ff..r1 * ff]);
        linear(gate, h2, &wts[o.gate.clone()], n, h, ff, false);
        linear(up, h2, &wts[o.up.clone()], n, h, ff, false);
        let act = &mut a.act[r0 * ff..r1 * ff];
        swiglu(act, gate, up);
        linear(d1, act, &wts[o.down.clone()], n, ff, h, false);
        let y = &mut a.y[r0 * h..r1 * h];
        for ((yv, mv), dv) in y.iter_mut().zip(m.iter()).zip(d1.iter()) {
            *yv = mv + dv;
        }
        let hf = &mut a.hf[r0 * h..r1 * h];
        rmsnorm(hf, &mut a.rf[r0..r1], y, &wts[o.norm.clone()], eps);
    }
}
