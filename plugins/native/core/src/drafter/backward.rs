//! Hand-written backward of the TTT forward ([`super::forward`]), steps in reverse order.
//!
//! `dy` of step `s` holds the final-norm gradient (from [`super::head`]) plus, once step
//! `s+1` is done, the gradient of its hidden input (`g` of step `s+1` is `y` of step `s`).
//! Key/value gradients `dk`, `dv` (all rows) are accumulated by every later step's attention
//! backward before step `s` turns them into projection gradients. Step 0's hidden gradient
//! ends in `fc` (the features have no gradient); the embedding is frozen.

use super::Drafter;
use super::attn::{self, Geom};
use super::layout::DrafterOffsets;
use super::plan::{Acts, Plan};
use super::trainer::SeqFeatures;
use crate::linalg::{linear_dw, linear_dx};
use crate::ops::mlp::swiglu_backward;
use crate::ops::norm::rmsnorm_backward;

/// Mutable views of every trainable tensor's gradient.
pub(crate) struct GradParts<'a> {
    pub fc: &'a mut [f32],
    pub ln_in: &'a mut [f32],
    pub ln_hidden: &'a mut [f32],
    pub q: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub o: &'a mut [f32],
    pub ln_post: &'a mut [f32],
    pub gate: &'a mut [f32],
    pub up: &'a mut [f32],
    pub down: &'a mut [f32],
    pub norm: &'a mut [f32],
    pub lm_head: &'a mut [f32],
}

/// Splits the gradient buffer (trainable layout) into its tensors.
pub(crate) fn grad_parts<'a>(o: &DrafterOffsets, buf: &'a mut [f32]) -> GradParts<'a> {
    let mut rest = buf;
    let mut pos = 0;
    let mut take = |r: &std::ops::Range<usize>| {
        let tail = std::mem::take(&mut rest).split_at_mut(r.start - pos).1;
        let (head, tail) = tail.split_at_mut(r.len());
        rest = tail;
        pos = r.end;
        head
    };
    GradParts {
        fc: take(&o.fc),
        ln_in: take(&o.ln_in),
        ln_hidden: take(&o.ln_hidden),
        q: take(&o.q),
        k: take(&o.k),
        v: take(&o.v),
        o: take(&o.o),
        ln_post: take(&o.ln_post),
        gate: take(&o.gate),
        up: take(&o.up),
        down: take(&o.down),
        norm: take(&o.norm),
        lm_head: take(&o.lm_head),
    }
}

/// `dw[j] += Σ_i dy[i·stride + off + j] · x[i, j] · rstd[i]` (an RMSNorm weight gradient
/// whose input gradient is not needed).
fn norm_dw(dw: &mut [f32], dy: &[f32], (stride, off): (usize, usize), x: &[f32], rstd: &[f32]) {
    let h = dw.len();
    for ((dr, xr), &r) in dy.chunks(stride).zip(x.chunks_exact(h)).zip(rstd) {
        for ((o, g), xv) in dw.iter_mut().zip(&dr[off..off + h]).zip(xr) {
            *o += g * xv * r;
        }
    }
}

/// Backward of [`super::forward::forward_steps`] into `gr`; `a.dy` must hold the head pass's
/// gradient.
pub(crate) fn backward_steps(
    d: &Drafter,
    seqs: &[SeqFeatures<'_>],
    plan: &Plan,
    a: &mut Acts<'_>,
    gr: &mut GradParts<'_>,
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
    let r = plan.r();
    let emb = &wts[o.embed.clone()];
    a.dk[..r * kvd].fill(0.0);
    a.dv[..r * kvd].fill(0.0);
    for s in (0..plan.steps).rev() {
        let (r0, r1) = (plan.step_off[s], plan.step_off[s + 1]);
        let n = r1 - r0;
        if n == 0 {
            continue;
        }
        let rows = &plan.rows[r0..r1];
        let (dy_prev, dy_rest) = a.dy.split_at_mut(r0 * h);
        let dy = &dy_rest[..n * h];
        // MLP: y = m + down(silu(gate(h2)) ⊙ up(h2)).
        let (f1, f2, f3) = (
            &mut a.f1[..n * ff],
            &mut a.f2[..n * ff],
            &mut a.f3[..n * ff],
        );
        linear_dx(f3, dy, &wts[o.down.clone()], n, ff, h, false);
        linear_dw(gr.down, dy, &a.act[r0 * ff..r1 * ff], n, ff, h, 1.0);
        swiglu_backward(
            f1,
            f2,
            f3,
            &a.gate[r0 * ff..r1 * ff],
            &a.up[r0 * ff..r1 * ff],
        );
        let dh2 = &mut a.a[..n * h];
        linear_dx(dh2, f1, &wts[o.gate.clone()], n, h, ff, false);
        linear_dx(dh2, f2, &wts[o.up.clone()], n, h, ff, true);
        let h2 = &a.h2[r0 * h..r1 * h];
        linear_dw(gr.gate, f1, h2, n, h, ff, 1.0);
        linear_dw(gr.up, f2, h2, n, h, ff, 1.0);
        let dm = &mut a.d1[..n * h];
        dm.copy_from_slice(dy);
        let (m, r2) = (&a.m[r0 * h..r1 * h], &a.r2[r0..r1]);
        let w_post = &wts[o.ln_post.clone()];
        rmsnorm_backward(dm, Some(&mut *gr.ln_post), dh2, m, w_post, r2, true);
        // Attention output: m = g + o_proj(att).
        let datt = &mut a.tq[..n * qd];
        linear_dx(datt, dm, &wts[o.o.clone()], n, qd, h, false);
        linear_dw(gr.o, dm, &a.att[r0 * qd..r1 * qd], n, qd, h, 1.0);
        super::forward::scatter_heads(a.hq, datt, (nh, hd, n, 0), None);
        let geom = Geom {
            plan,
            s,
            nh,
            kv,
            hd,
            w,
        };
        let (q, lse) = (&a.q[r0 * qd..r1 * qd], &a.lse[r0 * nh..r1 * nh]);
        let dq = &mut a.dq[..n * qd];
        let dout = &a.hq[..n * qd];
        attn::backward(dq, a.dk, a.dv, dout, q, a.k, a.v, lse, a.sc, geom);
        // Undo RoPE, back to token-major: dq → tq, dk → tk, dv → tv.
        let (tq, tk, tv) = (
            &mut a.tq[..n * qd],
            &mut a.tk[..n * kvd],
            &mut a.tv[..n * kvd],
        );
        for (i, &(_, t)) in rows.iter().enumerate() {
            let pos = t as usize + s;
            for hh in 0..nh {
                let dst = &mut tq[i * qd + hh * hd..][..hd];
                dst.copy_from_slice(&dq[(hh * n + i) * hd..][..hd]);
                d.rope.apply_backward(dst, pos);
            }
            for kh in 0..kv {
                let src = (kh * r + r0 + i) * hd;
                let dst = &mut tk[i * kvd + kh * hd..][..hd];
                dst.copy_from_slice(&a.dk[src..src + hd]);
                d.rope.apply_backward(dst, pos);
                tv[i * kvd + kh * hd..][..hd].copy_from_slice(&a.dv[src..src + hd]);
            }
        }
        // q/k/v read xcat = [input_layernorm(e) ‖ hidden_norm(g)].
        let dx = &mut a.d2[..n * 2 * h];
        let xcat = &a.xcat[r0 * 2 * h..r1 * 2 * h];
        linear_dx(dx, tq, &wts[o.q.clone()], n, 2 * h, qd, false);
        linear_dx(dx, tk, &wts[o.k.clone()], n, 2 * h, kvd, true);
        linear_dx(dx, tv, &wts[o.v.clone()], n, 2 * h, kvd, true);
        linear_dw(gr.q, tq, xcat, n, 2 * h, qd, 1.0);
        linear_dw(gr.k, tk, xcat, n, 2 * h, kvd, 1.0);
        linear_dw(gr.v, tv, xcat, n, 2 * h, kvd, 1.0);
        for (er, &(b, t)) in a.e.chunks_exact_mut(h).zip(rows) {
            let tok = seqs[b as usize].tokens[t as usize + s + 1] as usize;
            er.copy_from_slice(&emb[tok * h..(tok + 1) * h]);
        }
        norm_dw(gr.ln_in, dx, (2 * h, 0), &a.e[..n * h], &a.re[r0..r1]);
        let dag = &mut a.a[..n * h];
        for (dr, sr) in dag.chunks_exact_mut(h).zip(dx.chunks_exact(2 * h)) {
            dr.copy_from_slice(&sr[h..]);
        }
        // dg = dm (residual) + hidden_norm backward.
        let (g, rg) = (&a.g[r0 * h..r1 * h], &a.rg[r0..r1]);
        let w_hn = &wts[o.ln_hidden.clone()];
        rmsnorm_backward(dm, Some(&mut *gr.ln_hidden), dag, g, w_hn, rg, true);
        if s > 0 {
            for (dr, &(b, t)) in dm.chunks_exact(h).zip(rows) {
                let p = plan.row(s - 1, b as usize, t as usize);
                for (o, v) in dy_prev[p * h..(p + 1) * h].iter_mut().zip(dr) {
                    *o += v;
                }
            }
        } else {
            for (b, sq) in seqs.iter().enumerate() {
                let (nb, off) = (plan.n(0, b), plan.seq_off(0, b));
                let dg = &dm[off * h..(off + nb) * h];
                linear_dw(gr.fc, dg, &sq.feats[..nb * fd], nb, fd, h, 1.0);
            }
        }
    }
}
