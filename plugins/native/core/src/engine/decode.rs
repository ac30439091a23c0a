//! One batched decode step: every active row feeds its last token, K/V are appended to the
//! cache, attention reads the cache, and the next token is sampled. Projections are one
//! GEMM over all rows; attention is parallel over (row, kv head) with the query heads of a
//! group handled by one small GEMM against the cached keys. No allocation per token.

use rayon::prelude::*;

use super::{Engine, GenOutput, GenRequest, Row};
use crate::buffer::carve;
use crate::error::Result;
use crate::linalg::{Mat, add_bias, gemm_into, linear};
use crate::lora::{LoraAdapter, Target};
use crate::ops::mlp::swiglu;
use crate::ops::norm::rmsnorm;
use crate::sampling::{logprob_of, sample};

/// Adds each row's LoRA delta `s · (x Aᵀ) Bᵀ` for projection `t` of layer `l`.
#[allow(clippy::too_many_arguments)]
fn lora_rows(
    y: &mut [f32],
    x: &[f32],
    (k, n): (usize, usize),
    rows: &[Row],
    adapters: &[(String, LoraAdapter)],
    l: usize,
    t: Target,
    tmp: &mut [f32],
) {
    for (i, row) in rows.iter().enumerate() {
        let Some(ai) = row.adapter else { continue };
        let ad = &adapters[ai].1;
        let Some((ra, rb)) = ad.offs[l][t as usize].as_ref() else {
            continue;
        };
        let (w, r, s) = (ad.weights.as_slice(), ad.cfg.r, ad.cfg.scale());
        let xa = &mut tmp[..r];
        linear(xa, &x[i * k..(i + 1) * k], &w[ra.clone()], 1, k, r, false);
        gemm_into(
            &mut y[i * n..(i + 1) * n],
            n,
            1,
            n,
            r,
            Mat::rm(xa, r),
            Mat::rm_t(&w[rb.clone()], r),
            s,
            true,
        );
    }
}

impl Engine {
    pub(super) fn decode_step(
        &mut self,
        rows: &mut [Row],
        reqs: &[GenRequest],
        outs: &mut [GenOutput],
    ) -> Result<()> {
        let Engine {
            model,
            adapters,
            cfg: ecfg,
            kv,
            scratch,
            sample_scratch,
            ..
        } = self;
        let c = &model.cfg;
        let w = model.weights.as_slice();
        let m = rows.len();
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
        let eps = c.rms_norm_eps as f32;
        let scale = 1.0 / (hd as f32).sqrt();
        let r_max = (scratch.len() / nb)
            .saturating_sub(4 * d + 2 * qd + 2 * kvd + 3 * ff + vocab + nh * ms + 1);
        let [
            x,
            h,
            q,
            k,
            v,
            att,
            o,
            hf,
            gt,
            up,
            act,
            logits,
            scores,
            rstd,
            lt,
        ] = carve(
            scratch.as_mut_slice(),
            [
                m * d,
                m * d,
                m * qd,
                m * kvd,
                m * kvd,
                m * qd,
                m * d,
                m * d,
                m * ff,
                m * ff,
                m * ff,
                m * vocab,
                m * nh * ms,
                m,
                r_max.max(1),
            ],
        )?;
        let emb = &w[model.offs.embed.clone()];
        for (xr, row) in x.chunks_exact_mut(d).zip(rows.iter()) {
            let t = row.token as usize;
            xr.copy_from_slice(&emb[t * d..(t + 1) * d]);
        }
        let half = c.num_hidden_layers * nb * nkv * ms * hd;
        for (l, lo) in model.offs.layers.iter().enumerate() {
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
                lora_rows(dst, h, (d, dim), rows, adapters, l, t, lt);
            }
            let kvs = kv.as_mut_slice();
            for (i, row) in rows.iter().enumerate() {
                for hh in 0..nh {
                    model.rope.apply(&mut q[i * qd + hh * hd..][..hd], row.pos);
                }
                for hh in 0..nkv {
                    let kr = &mut k[i * kvd + hh * hd..][..hd];
                    model.rope.apply(kr, row.pos);
                    let dst = (((l * nb + row.slot) * nkv + hh) * ms + row.pos) * hd;
                    kvs[dst..dst + hd].copy_from_slice(kr);
                    kvs[half + dst..half + dst + hd].copy_from_slice(&v[i * kvd + hh * hd..][..hd]);
                }
            }
            let kvs: &[f32] = kvs;
            let qs: &[f32] = q;
            att.par_chunks_mut(g * hd)
                .zip(scores.par_chunks_mut(g * ms))
                .enumerate()
                .for_each(|(idx, (att_g, sc))| {
                    let (i, kh) = (idx / nkv, idx % nkv);
                    let row = &rows[i];
                    let len = row.pos + 1;
                    let base = (((l * nb + row.slot) * nkv + kh) * ms) * hd;
                    let kc = &kvs[base..base + len * hd];
                    let vc = &kvs[half + base..half + base + len * hd];
                    let qg = &qs[i * qd + kh * g * hd..][..g * hd];
                    let s = &mut sc[..g * len];
                    gemm_into(
                        s,
                        len,
                        g,
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
                        g,
                        hd,
                        len,
                        Mat::rm(s, len),
                        Mat::rm(vc, hd),
                        1.0,
                        false,
                    );
                });
            linear(o, att, &w[lo.o.clone()], m, qd, d, false);
            if let Some(b) = &lo.o_b {
                add_bias(o, &w[b.clone()]);
            }
            lora_rows(o, att, (qd, d), rows, adapters, l, Target::O, lt);
            x.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
            rmsnorm(h, rstd, x, &w[lo.ln2.clone()], eps);
            linear(gt, h, &w[lo.gate.clone()], m, d, ff, false);
            lora_rows(gt, h, (d, ff), rows, adapters, l, Target::Gate, lt);
            linear(up, h, &w[lo.up.clone()], m, d, ff, false);
            lora_rows(up, h, (d, ff), rows, adapters, l, Target::Up, lt);
            swiglu(act, gt, up);
            linear(o, act, &w[lo.down.clone()], m, ff, d, false);
            lora_rows(o, act, (ff, d), rows, adapters, l, Target::Down, lt);
            x.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
        }
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
        for (i, row) in rows.iter_mut().enumerate() {
            let lg = &logits[i * vocab..(i + 1) * vocab];
            let tok = sample(lg, &reqs[row.req].sampling, &mut row.rng, sample_scratch);
            let out = &mut outs[row.req];
            out.tokens.push(tok as u32);
            out.logprobs.push(logprob_of(lg, tok));
            if let Some(hs) = out.hidden.as_mut() {
                hs.extend_from_slice(&hf[i * d..(i + 1) * d]);
            }
            row.token = tok as u32;
            row.pos += 1;
        }
        Ok(())
    }
}
