//! Multi-token verify step of speculative decoding: each row feeds `n ≥ 1` tokens at
//! positions `pos .. pos + n` of its cache slot (the last verified token and the drafts),
//! their K/V are appended to the cache, and every fed position yields logits, its final-norm
//! hidden row and its aux features.
//!
//! Cost model (batch-1 CPU decode is memory bound): projections are ONE GEMM over all `Σn`
//! rows (weights read once per step, as in a decode step); attention is one task per (row,
//! kv head) that reads the row's cached keys and values once for all `n · group` queries,
//! with a causal mask inside the new tokens. LoRA is one GEMM pair per run of consecutive
//! rows sharing an adapter. Nothing is allocated per step: every tensor is a piece of the
//! `activations/verify` scratch sized by [`scratch_len`].
//!
//! Row `j` of a verify row with `n = 1` is computed by exactly the operations of a decode
//! step (same attention shapes); with `n > 1` the projection GEMMs have more rows, so float
//! results may differ from a decode step's in the last bits (see `NOTES.md`).

use rayon::prelude::*;

use super::EngineConfig;
use super::prefill::copy_aux;
use crate::buffer::carve;
use crate::config::ModelConfig;
use crate::error::{NativeError, Result};
use crate::linalg::{Mat, add_bias, gemm_into, linear};
use crate::lora::{LoraAdapter, Target};
use crate::model::Model;
use crate::ops::mlp::swiglu;
use crate::ops::norm::rmsnorm;

/// One row of a verify step: `n ≥ 1` tokens at positions `pos .. pos + n` of cache `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct VRow {
    pub slot: usize,
    pub pos: usize,
    pub n: usize,
    pub adapter: Option<usize>,
}

/// Results of a verify step, one entry per fed token (rows in order, `Σn` in all).
pub(super) struct VerifyOut<'a> {
    /// `[Σn, vocab]` raw logits.
    pub logits: &'a [f32],
    /// `[Σn, hidden]` final-norm outputs (lm_head inputs).
    pub hidden: &'a [f32],
    /// `[Σn, aux.len() · hidden]` residual streams entering the aux layers.
    pub aux: &'a [f32],
}

/// f32 elements of the verify scratch for `max_batch` rows of up to `nmax` tokens, LoRA rank
/// up to `r` and `n_aux` aux layers.
pub(super) fn scratch_len(
    c: &ModelConfig,
    e: &EngineConfig,
    nmax: usize,
    r: usize,
    n_aux: usize,
) -> usize {
    let m = e.max_batch * nmax;
    let (d, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    m * (4 * d
        + 3 * qd
        + 2 * kvd
        + 3 * ff
        + c.vocab_size
        + 1
        + r.max(1)
        + n_aux * d
        + c.num_attention_heads * e.max_seq)
}

/// Adds `s · (x Aᵀ) Bᵀ` of projection `t` of layer `l` to each run of consecutive rows that
/// share an adapter (one GEMM pair per run).
#[allow(clippy::too_many_arguments)]
fn lora_runs(
    y: &mut [f32],
    x: &[f32],
    (k, n): (usize, usize),
    rows: &[VRow],
    adapters: &[(String, LoraAdapter)],
    l: usize,
    t: Target,
    tmp: &mut [f32],
) {
    let (mut i, mut r0) = (0, 0);
    while i < rows.len() {
        let a = rows[i].adapter;
        let (mut j, mut cnt) = (i, 0);
        while j < rows.len() && rows[j].adapter == a {
            cnt += rows[j].n;
            j += 1;
        }
        let ab = a.and_then(|ai| {
            let ad = &adapters[ai].1;
            ad.offs[l][t as usize].as_ref().map(|ab| (ad, ab))
        });
        if let Some((ad, (ra, rb))) = ab {
            let (w, r, s) = (ad.weights.as_slice(), ad.cfg.r, ad.cfg.scale());
            let xa = &mut tmp[..cnt * r];
            linear(
                xa,
                &x[r0 * k..(r0 + cnt) * k],
                &w[ra.clone()],
                cnt,
                k,
                r,
                false,
            );
            gemm_into(
                &mut y[r0 * n..(r0 + cnt) * n],
                n,
                cnt,
                n,
                r,
                Mat::rm(xa, r),
                Mat::rm_t(&w[rb.clone()], r),
                s,
                true,
            );
        }
        r0 += cnt;
        i = j;
    }
}

/// In-place softmax of each score row over its first `live` columns; the rest become 0.
fn masked_softmax(sr: &mut [f32], live: usize) {
    let (on, off) = sr.split_at_mut(live);
    let mx = on.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0.0;
    for e in on.iter_mut() {
        *e = (*e - mx).exp();
        sum += *e;
    }
    let inv = 1.0 / sum;
    on.iter_mut().for_each(|e| *e *= inv);
    off.fill(0.0);
}

/// Runs one verify step over `rows` (`tokens` holds each row's `n` tokens in row order) and
/// returns views of the results inside `scratch`. Writes K/V of every fed position into `kv`.
#[allow(clippy::too_many_arguments)]
pub(super) fn verify<'s>(
    model: &Model,
    adapters: &[(String, LoraAdapter)],
    ecfg: &EngineConfig,
    kv: &mut [f32],
    scratch: &'s mut [f32],
    rows: &[VRow],
    tokens: &[u32],
    aux_layers: &[usize],
) -> Result<VerifyOut<'s>> {
    let c = &model.cfg;
    let w = model.weights.as_slice();
    let (nb, ms) = (ecfg.max_batch, ecfg.max_seq);
    let (d, qd, kvd, ff, vocab) = (
        c.hidden_size,
        c.q_dim(),
        c.kv_dim(),
        c.intermediate_size,
        c.vocab_size,
    );
    let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let g = nh / nkv;
    let m: usize = rows.iter().map(|r| r.n).sum();
    let nr = rows.len();
    let nmax = rows.iter().map(|r| r.n).max().unwrap_or(0);
    let lmax = rows.iter().map(|r| r.pos + r.n).max().unwrap_or(0);
    if let Some(r) = rows
        .iter()
        .find(|r| r.n == 0 || r.pos + r.n > ms || r.slot >= nb)
    {
        return Err(NativeError::Input(format!(
            "verify row {r:?} does not fit the cache (max_batch {nb}, max_seq {ms})"
        )));
    }
    if tokens.len() != m {
        return Err(NativeError::Input(format!(
            "verify: {} tokens for rows feeding {m}",
            tokens.len()
        )));
    }
    model.check_tokens(tokens)?;
    let r_max = rows
        .iter()
        .filter_map(|r| r.adapter.map(|a| adapters[a].1.cfg.r))
        .max()
        .unwrap_or(0);
    let eps = c.rms_norm_eps as f32;
    let scale = 1.0 / (hd as f32).sqrt();
    let na = aux_layers.len();
    let [
        x,
        h,
        q,
        qt,
        att,
        k,
        v,
        o,
        hf,
        gt,
        up,
        act,
        logits,
        scores,
        rstd,
        lt,
        aux,
    ] = carve(
        scratch,
        [
            m * d,
            m * d,
            m * qd,
            nr * nmax * qd,
            nr * nmax * qd,
            m * kvd,
            m * kvd,
            m * d,
            m * d,
            m * ff,
            m * ff,
            m * ff,
            m * vocab,
            nr * nh * nmax * lmax,
            m,
            m * r_max,
            m * na * d,
        ],
    )?;
    let emb = &w[model.offs.embed.clone()];
    for (xr, &t) in x.chunks_exact_mut(d).zip(tokens) {
        xr.copy_from_slice(&emb[t as usize * d..(t as usize + 1) * d]);
    }
    let half = c.num_hidden_layers * nb * nkv * ms * hd;
    let (qchunk, schunk) = (nmax * g * hd, nmax * g * lmax);
    for (l, lo) in model.offs.layers.iter().enumerate() {
        copy_aux(l, x, aux_layers, (0, m, d), aux);
        rmsnorm(h, rstd, x, &w[lo.ln1.clone()], eps);
        for (dst, wr, br, dim, t) in [
            (&mut *q, &lo.q, &lo.q_b, qd, Target::Q),
            (&mut *k, &lo.k, &lo.k_b, kvd, Target::K),
            (&mut *v, &lo.v, &lo.v_b, kvd, Target::V),
        ] {
            linear(dst, h, &w[wr.clone()], m, d, dim, false);
            if let Some(b) = br {
                add_bias(dst, &w[b.clone()]);
            }
            lora_runs(dst, h, (d, dim), rows, adapters, l, t, lt);
        }
        // RoPE, K/V into the cache, queries regrouped per (row, kv head): `[t][j][hd]`.
        let kvs = &mut *kv;
        let mut r0 = 0;
        for (i, row) in rows.iter().enumerate() {
            for ti in 0..row.n {
                let (fr, p) = (r0 + ti, row.pos + ti);
                let qr = &mut q[fr * qd..(fr + 1) * qd];
                for hh in 0..nh {
                    model.rope.apply(&mut qr[hh * hd..(hh + 1) * hd], p);
                }
                for kh in 0..nkv {
                    let dst = (i * nkv + kh) * qchunk + ti * g * hd;
                    qt[dst..dst + g * hd].copy_from_slice(&qr[kh * g * hd..(kh + 1) * g * hd]);
                    let kr = &mut k[fr * kvd + kh * hd..][..hd];
                    model.rope.apply(kr, p);
                    let dst = (((l * nb + row.slot) * nkv + kh) * ms + p) * hd;
                    kvs[dst..dst + hd].copy_from_slice(kr);
                    kvs[half + dst..half + dst + hd]
                        .copy_from_slice(&v[fr * kvd + kh * hd..][..hd]);
                }
            }
            r0 += row.n;
        }
        let kvs: &[f32] = kvs;
        let qts: &[f32] = qt;
        att.par_chunks_mut(qchunk)
            .zip(scores.par_chunks_mut(schunk))
            .enumerate()
            .for_each(|(idx, (att_g, sc))| {
                let (i, kh) = (idx / nkv, idx % nkv);
                let row = &rows[i];
                let (n, len) = (row.n, row.pos + row.n);
                let base = (((l * nb + row.slot) * nkv + kh) * ms) * hd;
                let kc = &kvs[base..base + len * hd];
                let vc = &kvs[half + base..half + base + len * hd];
                let qg = &qts[idx * qchunk..][..n * g * hd];
                let s = &mut sc[..n * g * len];
                gemm_into(
                    s,
                    len,
                    n * g,
                    len,
                    hd,
                    Mat::rm(qg, hd),
                    Mat::rm_t(kc, hd),
                    scale,
                    false,
                );
                // Query (t, j) sees the cache and the new tokens up to its own position.
                for (qi, sr) in s.chunks_exact_mut(len).enumerate() {
                    masked_softmax(sr, row.pos + qi / g + 1);
                }
                gemm_into(
                    &mut att_g[..n * g * hd],
                    hd,
                    n * g,
                    hd,
                    len,
                    Mat::rm(s, len),
                    Mat::rm(vc, hd),
                    1.0,
                    false,
                );
            });
        // Back to token-major `[Σn, q_dim]` (into `q`, free now).
        let mut r0 = 0;
        for (i, row) in rows.iter().enumerate() {
            for ti in 0..row.n {
                for kh in 0..nkv {
                    let src = (i * nkv + kh) * qchunk + ti * g * hd;
                    q[(r0 + ti) * qd + kh * g * hd..][..g * hd]
                        .copy_from_slice(&att[src..src + g * hd]);
                }
            }
            r0 += row.n;
        }
        linear(o, q, &w[lo.o.clone()], m, qd, d, false);
        if let Some(b) = &lo.o_b {
            add_bias(o, &w[b.clone()]);
        }
        lora_runs(o, q, (qd, d), rows, adapters, l, Target::O, lt);
        x.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
        rmsnorm(h, rstd, x, &w[lo.ln2.clone()], eps);
        linear(gt, h, &w[lo.gate.clone()], m, d, ff, false);
        lora_runs(gt, h, (d, ff), rows, adapters, l, Target::Gate, lt);
        linear(up, h, &w[lo.up.clone()], m, d, ff, false);
        lora_runs(up, h, (d, ff), rows, adapters, l, Target::Up, lt);
        swiglu(act, gt, up);
        linear(o, act, &w[lo.down.clone()], m, ff, d, false);
        lora_runs(o, act, (ff, d), rows, adapters, l, Target::Down, lt);
        x.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
    }
    copy_aux(c.num_hidden_layers, x, aux_layers, (0, m, d), aux);
    rmsnorm(hf, rstd, x, &w[model.offs.norm.clone()], eps);
    linear(
        logits,
        hf,
        &w[model.offs.lm_head.clone()],
        m,
        d,
        vocab,
        false,
    );
    Ok(VerifyOut {
        logits,
        hidden: hf,
        aux,
    })
}
