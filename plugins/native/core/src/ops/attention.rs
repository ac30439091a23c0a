//! Causal grouped-query attention over head-major tensors (training / prefill path).
//!
//! Layouts: `q`, `o` are `[B, H, T, hd]`; `k`, `v` are `[B, KV, T, hd]`. Only the per-row
//! log-sum-exp `lse` `[B, H, T]` of the scaled, masked scores is saved; backward recomputes
//! the softmax from `q`, `k` and `lse` (memory O(T) per head instead of O(T²)). Query head
//! `h` reads kv head `h / (H / KV)`. Work is split over heads with rayon; each task has a
//! `[T, T]` scratch.

use rayon::prelude::*;

use crate::linalg::{Mat, gemm_into};

/// Shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Sequences.
    pub b: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads.
    pub kv: usize,
    /// Sequence length.
    pub t: usize,
    /// Head width.
    pub hd: usize,
}

impl AttnShape {
    fn group(&self) -> usize {
        self.h / self.kv
    }
    fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }
}

/// In-place causal softmax of a `[t, t]` score matrix (row i keeps columns 0..=i); writes
/// each row's log-sum-exp into `lse`.
fn causal_softmax(p: &mut [f32], lse: &mut [f32], t: usize) {
    for ((i, row), l) in p.chunks_exact_mut(t).enumerate().zip(lse.iter_mut()) {
        let (live, dead) = row.split_at_mut(i + 1);
        let m = live.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut s = 0.0;
        for x in live.iter_mut() {
            *x = (*x - m).exp();
            s += *x;
        }
        let inv = 1.0 / s;
        for x in live.iter_mut() {
            *x *= inv;
        }
        dead.fill(0.0);
        *l = m + s.ln();
    }
}

/// Recomputes the causal softmax of a `[t, t]` score matrix from the saved `lse`.
fn causal_softmax_from_lse(p: &mut [f32], lse: &[f32], t: usize) {
    for ((i, row), l) in p.chunks_exact_mut(t).enumerate().zip(lse) {
        let (live, dead) = row.split_at_mut(i + 1);
        for x in live.iter_mut() {
            *x = (*x - l).exp();
        }
        dead.fill(0.0);
    }
}

/// Forward: `o = softmax(q kᵀ / sqrt(hd) + causal mask) v`, saving the row log-sum-exp.
pub fn attention(o: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], s: AttnShape) {
    let (t, hd, g) = (s.t, s.hd, s.group());
    o.par_chunks_mut(t * hd)
        .zip(lse.par_chunks_mut(t))
        .enumerate()
        .for_each_init(
            || vec![0f32; t * t],
            |p, (idx, (o_bh, lse_bh))| {
                let (b, h) = (idx / s.h, idx % s.h);
                let kvi = (b * s.kv + h / g) * t * hd;
                let q_bh = &q[idx * t * hd..(idx + 1) * t * hd];
                let k_b = &k[kvi..kvi + t * hd];
                let v_b = &v[kvi..kvi + t * hd];
                gemm_into(
                    p,
                    t,
                    t,
                    t,
                    hd,
                    Mat::rm(q_bh, hd),
                    Mat::rm_t(k_b, hd),
                    s.scale(),
                    false,
                );
                causal_softmax(p, lse_bh, t);
                gemm_into(
                    o_bh,
                    hd,
                    t,
                    hd,
                    t,
                    Mat::rm(p, t),
                    Mat::rm(v_b, hd),
                    1.0,
                    false,
                );
            },
        );
}

/// Backward: writes `dq`, `dk`, `dv` from `do_`, the saved `q`, `k`, `v` and row `lse`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    do_: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    lse: &[f32],
    s: AttnShape,
) {
    let (t, hd, g) = (s.t, s.hd, s.group());
    dq.par_chunks_mut(g * t * hd)
        .zip(dk.par_chunks_mut(t * hd))
        .zip(dv.par_chunks_mut(t * hd))
        .enumerate()
        .for_each_init(
            || (vec![0f32; t * t], vec![0f32; t * t]),
            |(p_h, dp), (gi, ((dq_g, dk_b), dv_b))| {
                let kvi = gi * t * hd;
                let k_b = &k[kvi..kvi + t * hd];
                let v_b = &v[kvi..kvi + t * hd];
                for j in 0..g {
                    let hi = gi * g + j; // flat (b, h) index
                    let qo = hi * t * hd;
                    let q_h = &q[qo..qo + t * hd];
                    let do_h = &do_[qo..qo + t * hd];
                    let p_h = p_h.as_mut_slice();
                    let dp = dp.as_mut_slice();
                    gemm_into(
                        p_h,
                        t,
                        t,
                        t,
                        hd,
                        Mat::rm(q_h, hd),
                        Mat::rm_t(k_b, hd),
                        s.scale(),
                        false,
                    );
                    causal_softmax_from_lse(p_h, &lse[hi * t..(hi + 1) * t], t);
                    let dq_h = &mut dq_g[j * t * hd..(j + 1) * t * hd];
                    // dV += Pᵀ dO
                    gemm_into(
                        dv_b,
                        hd,
                        t,
                        hd,
                        t,
                        Mat::rm_t(p_h, t),
                        Mat::rm(do_h, hd),
                        1.0,
                        j > 0,
                    );
                    // dP = dO Vᵀ
                    gemm_into(
                        dp,
                        t,
                        t,
                        t,
                        hd,
                        Mat::rm(do_h, hd),
                        Mat::rm_t(v_b, hd),
                        1.0,
                        false,
                    );
                    // dS = P ⊙ (dP − rowsum(P ⊙ dP)), stored into p
                    for (prow, dprow) in p_h.chunks_exact_mut(t).zip(dp.chunks_exact(t)) {
                        let dot: f32 = prow.iter().zip(dprow).map(|(a, b)| a * b).sum();
                        for (x, d) in prow.iter_mut().zip(dprow) {
                            *x *= d - dot;
                        }
                    }
                    // dQ = scale · dS K ; dK += scale · dSᵀ Q
                    gemm_into(
                        dq_h,
                        hd,
                        t,
                        hd,
                        t,
                        Mat::rm(p_h, t),
                        Mat::rm(k_b, hd),
                        s.scale(),
                        false,
                    );
                    gemm_into(
                        dk_b,
                        hd,
                        t,
                        hd,
                        t,
                        Mat::rm_t(p_h, t),
                        Mat::rm(q_h, hd),
                        s.scale(),
                        j > 0,
                    );
                }
            },
        );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check, seq};

    #[test]
    fn attention_grads_match_finite_differences() {
        let s = AttnShape {
            b: 2,
            h: 4,
            kv: 2,
            t: 5,
            hd: 4,
        };
        let nq = s.b * s.h * s.t * s.hd;
        let nk = s.b * s.kv * s.t * s.hd;
        let q0 = seq(nq, 1.0, 10);
        let k0 = seq(nk, 1.0, 11);
        let v0 = seq(nk, 1.0, 12);
        let r = seq(nq, 1.0, 13);
        let np = s.b * s.h * s.t;
        let f = |q: &[f32], k: &[f32], v: &[f32]| {
            let mut o = vec![0.0; nq];
            let mut p = vec![0.0; np];
            attention(&mut o, &mut p, q, k, v, s);
            o.iter()
                .zip(&r)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>()
        };
        let mut o = vec![0.0; nq];
        let mut p = vec![0.0; np];
        attention(&mut o, &mut p, &q0, &k0, &v0, s);
        // Causality: the first query of each head attends to key 0 only, so o == v[0].
        assert!((o[0] - v0[0]).abs() < 1e-6);
        let (mut dq, mut dk, mut dv) = (vec![0.0; nq], vec![0.0; nk], vec![0.0; nk]);
        attention_backward(&mut dq, &mut dk, &mut dv, &r, &q0, &k0, &v0, &p, s);
        check("attn dq", &q0, &dq, |q| f(q, &k0, &v0));
        check("attn dk", &k0, &dk, |k| f(&q0, k, &v0));
        check("attn dv", &v0, &dv, |v| f(&q0, &k0, v));
    }
}
