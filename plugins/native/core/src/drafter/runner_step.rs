//! Inference kernels of the drafter runner over its KV cache (`k[slot][kv][max_seq][hd]`,
//! then `v` of the same shape): writing verified cache entries of all rows in chunks
//! ([`ctx_entries`]: only `fc`, the norms and the k/v projections — their outputs are not
//! needed) and one draft
//! step over all rows ([`step_rows`]: one GEMM per projection, attention per (row, kv head)
//! over the slot's cache `0..=pos`). Same arithmetic as the TTT forward, no allocation.

use rayon::prelude::*;

use super::Drafter;
use super::forward::norm_into;
use crate::linalg::{Mat, gemm_into, linear};
use crate::ops::mlp::swiglu;
use crate::ops::norm::rmsnorm;

/// Rows of one chunk of verified entries.
pub(crate) const CTX_CHUNK: usize = 64;

/// Cache geometry: `(max_batch, max_seq)`.
#[derive(Clone, Copy)]
pub(crate) struct Cache {
    pub nb: usize,
    pub ms: usize,
}

impl Cache {
    /// Offset of `(slot, kv head, pos)` in the `k` half.
    fn at(&self, d: &Drafter, slot: usize, kh: usize, pos: usize) -> usize {
        let (kv, hd) = (d.cfg.num_key_value_heads, d.cfg.head_dim);
        (((slot * kv + kh) * self.ms) + pos) * hd
    }
    /// Length of the `k` half.
    pub fn half(&self, d: &Drafter) -> usize {
        self.nb * d.cfg.kv_dim() * self.ms
    }
}

/// Scratch of [`ctx_entries`] (`CTX_CHUNK` rows each).
pub(crate) struct CtxBufs<'a> {
    pub g: &'a mut [f32],
    pub e: &'a mut [f32],
    pub x: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub r: &'a mut [f32],
}

/// Scratch of [`step_rows`] (`max_batch` rows each; `g` holds the hidden input and receives
/// the output, `logits` the draft logits).
pub(crate) struct StepBufs<'a> {
    pub g: &'a mut [f32],
    pub e: &'a mut [f32],
    pub x: &'a mut [f32],
    pub q: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub att: &'a mut [f32],
    pub o: &'a mut [f32],
    pub m: &'a mut [f32],
    pub h2: &'a mut [f32],
    pub gate: &'a mut [f32],
    pub up: &'a mut [f32],
    pub act: &'a mut [f32],
    pub hf: &'a mut [f32],
    pub logits: &'a mut [f32],
    pub scores: &'a mut [f32],
    pub r: &'a mut [f32],
}

/// Embedding rows of `toks` into `e`, then `x = [input_layernorm(e) ‖ hidden_norm(g)]`.
fn inputs(d: &Drafter, toks: &[u32], g: &[f32], e: &mut [f32], x: &mut [f32], r: &mut [f32]) {
    let (w, o) = (d.w(), &d.offs);
    let h = d.cfg.hidden_size;
    let eps = d.cfg.rms_norm_eps as f32;
    let emb = &w[o.embed.clone()];
    for (er, &t) in e.chunks_exact_mut(h).zip(toks) {
        er.copy_from_slice(&emb[t as usize * h..(t as usize + 1) * h]);
    }
    let n = toks.len();
    norm_into(x, (2 * h, 0), &e[..n * h], &w[o.ln_in.clone()], eps, r);
    norm_into(x, (2 * h, h), &g[..n * h], &w[o.ln_hidden.clone()], eps, r);
}

/// Rotates the keys of row `i` (position `pos`) and stores keys and values at `(slot, pos)`.
fn store_kv(
    d: &Drafter,
    kv: &mut [f32],
    c: Cache,
    (k, v): (&mut [f32], &[f32]),
    slot: usize,
    pos: usize,
) {
    let (nkv, hd) = (d.cfg.num_key_value_heads, d.cfg.head_dim);
    let half = c.half(d);
    for kh in 0..nkv {
        let kr = &mut k[kh * hd..(kh + 1) * hd];
        d.rope.apply(kr, pos);
        let at = c.at(d, slot, kh, pos);
        kv[at..at + hd].copy_from_slice(kr);
        kv[half + at..half + at + hd].copy_from_slice(&v[kh * hd..(kh + 1) * hd]);
    }
}

/// Writes the cache entries `(slots[i], pos[i])` of up to [`CTX_CHUNK`] verified positions
/// from their features (`feats`, `[n, 3·H_target]`) and next tokens (`toks`).
pub(crate) fn ctx_entries(
    d: &Drafter,
    kv: &mut [f32],
    c: Cache,
    b: &mut CtxBufs<'_>,
    feats: &[f32],
    toks: &[u32],
    (slots, pos): (&[usize], &[usize]),
) {
    let cfg = &d.cfg;
    let (h, kvd, fd) = (cfg.hidden_size, cfg.kv_dim(), cfg.feat_dim());
    let w = d.w();
    let n = toks.len();
    linear(
        &mut b.g[..n * h],
        &feats[..n * fd],
        &w[d.offs.fc.clone()],
        n,
        fd,
        h,
        false,
    );
    inputs(d, toks, b.g, b.e, &mut b.x[..n * 2 * h], b.r);
    let x = &b.x[..n * 2 * h];
    linear(
        &mut b.k[..n * kvd],
        x,
        &w[d.offs.k.clone()],
        n,
        2 * h,
        kvd,
        false,
    );
    linear(
        &mut b.v[..n * kvd],
        x,
        &w[d.offs.v.clone()],
        n,
        2 * h,
        kvd,
        false,
    );
    for i in 0..n {
        let kr = &mut b.k[i * kvd..(i + 1) * kvd];
        store_kv(
            d,
            kv,
            c,
            (kr, &b.v[i * kvd..(i + 1) * kvd]),
            slots[i],
            pos[i],
        );
    }
}

/// One draft step over `m` rows: hidden inputs in `b.g`, input tokens `toks`, row `i` at
/// cache `(slots[i], pos[i])`. Writes the rows' cache entries, the new hidden states (into
/// `b.g`) and the draft logits (`b.logits`, `[m, draft_vocab]`).
pub(crate) fn step_rows(
    d: &Drafter,
    kv: &mut [f32],
    c: Cache,
    b: &mut StepBufs<'_>,
    (slots, pos): (&[usize], &[usize]),
    toks: &[u32],
) {
    let cfg = &d.cfg;
    let (w, o) = (d.w(), &d.offs);
    let m = toks.len();
    let (h, qd, kvd, ff, vd) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
        cfg.draft_vocab_size,
    );
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let grp = nh / nkv;
    let eps = cfg.rms_norm_eps as f32;
    let scale = 1.0 / (hd as f32).sqrt();
    inputs(d, toks, b.g, b.e, &mut b.x[..m * 2 * h], b.r);
    let x = &b.x[..m * 2 * h];
    let q = &mut b.q[..m * qd];
    linear(q, x, &w[o.q.clone()], m, 2 * h, qd, false);
    linear(
        &mut b.k[..m * kvd],
        x,
        &w[o.k.clone()],
        m,
        2 * h,
        kvd,
        false,
    );
    linear(
        &mut b.v[..m * kvd],
        x,
        &w[o.v.clone()],
        m,
        2 * h,
        kvd,
        false,
    );
    for i in 0..m {
        for hh in 0..nh {
            d.rope.apply(&mut q[i * qd + hh * hd..][..hd], pos[i]);
        }
        let kr = &mut b.k[i * kvd..(i + 1) * kvd];
        store_kv(
            d,
            kv,
            c,
            (kr, &b.v[i * kvd..(i + 1) * kvd]),
            slots[i],
            pos[i],
        );
    }
    let (kvs, qs): (&[f32], &[f32]) = (kv, q);
    let half = c.half(d);
    b.att[..m * qd]
        .par_chunks_mut(grp * hd)
        .zip(b.scores.par_chunks_mut(grp * c.ms))
        .enumerate()
        .for_each(|(idx, (att_g, sc))| {
            let (i, kh) = (idx / nkv, idx % nkv);
            let len = pos[i] + 1;
            let base = c.at(d, slots[i], kh, 0);
            let kc = &kvs[base..base + len * hd];
            let vc = &kvs[half + base..half + base + len * hd];
            let qg = &qs[i * qd + kh * grp * hd..][..grp * hd];
            let s = &mut sc[..grp * len];
            gemm_into(
                s,
                len,
                grp,
                len,
                hd,
                Mat::rm(qg, hd),
                Mat::rm_t(kc, hd),
                scale,
                false,
            );
            for sr in s.chunks_exact_mut(len) {
                let mx = sr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let mut sum = 0.0;
                for e in sr.iter_mut() {
                    *e = (*e - mx).exp();
                    sum += *e;
                }
                let inv = 1.0 / sum;
                sr.iter_mut().for_each(|e| *e *= inv);
            }
            gemm_into(
                att_g,
                hd,
                grp,
                hd,
                len,
                Mat::rm(s, len),
                Mat::rm(vc, hd),
                1.0,
                false,
            );
        });
    let (g, om, mm) = (&mut b.g[..m * h], &mut b.o[..m * h], &mut b.m[..m * h]);
    linear(om, &b.att[..m * qd], &w[o.o.clone()], m, qd, h, false);
    for ((mv, gv), ov) in mm.iter_mut().zip(g.iter()).zip(om.iter()) {
        *mv = gv + ov;
    }
    let h2 = &mut b.h2[..m * h];
    rmsnorm(h2, &mut b.r[..m], mm, &w[o.ln_post.clone()], eps);
    let (gate, up, act) = (
        &mut b.gate[..m * ff],
        &mut b.up[..m * ff],
        &mut b.act[..m * ff],
    );
    linear(gate, h2, &w[o.gate.clone()], m, h, ff, false);
    linear(up, h2, &w[o.up.clone()], m, h, ff, false);
    swiglu(act, gate, up);
    linear(om, act, &w[o.down.clone()], m, ff, h, false);
    for ((gv, mv), ov) in g.iter_mut().zip(mm.iter()).zip(om.iter()) {
        *gv = mv + ov;
    }
    let hf = &mut b.hf[..m * h];
    rmsnorm(hf, &mut b.r[..m], g, &w[o.norm.clone()], eps);
    let lm = &w[o.lm_head.clone()];
    linear(&mut b.logits[..m * vd], hf, lm, m, h, vd, false);
}
