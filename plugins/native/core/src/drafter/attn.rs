//! TTT attention of one step `s`: query `(s, b, t)` attends the step-0 keys `(0, b, u)` for
//! `u ≤ t` and the chain's own keys `(s', b, t)` for `1 ≤ s' ≤ s` — exactly the cache an
//! inference chain sees (verified entries, then its own scratch entries).
//!
//! Layouts ([`super::plan`]): queries and outputs of step `s` head-major `[heads][N_s][hd]`,
//! row log-sum-exp `[heads][N_s]`, keys/values (and their gradients) `[kv][R][hd]` over all
//! rows. Work is split over kv heads (rayon); each task owns a `2 · BLK · w` score scratch
//! of the activations buffer and walks its query heads, sequences and blocks of `BLK` rows:
//! one GEMM against the step-0 keys `0..t_max`, a dot product per chain key. Backward
//! recomputes the softmax from the saved log-sum-exp.

use rayon::prelude::*;

use super::plan::{BLK, Plan};
use crate::linalg::{Mat, gemm_into};

/// Shape of the attention of one step.
#[derive(Clone, Copy)]
pub(crate) struct Geom<'a> {
    pub plan: &'a Plan,
    pub s: usize,
    pub nh: usize,
    pub kv: usize,
    pub hd: usize,
    /// Width of a score row in the scratch (≥ longest sequence + steps).
    pub w: usize,
}

impl Geom<'_> {
    fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

/// One block of query rows: its sequence, first row within the step, first position,
/// row count and key count (`t1`: step-0 keys `0..t1`).
struct Block {
    b: usize,
    i0: usize,
    t0: usize,
    bl: usize,
    t1: usize,
}

fn blocks(plan: &Plan, s: usize) -> impl Iterator<Item = Block> + '_ {
    (0..plan.nseq()).flat_map(move |b| {
        let (n, lo, off) = (plan.n(s, b), plan.lo(s, b), plan.seq_off(s, b));
        (0..n).step_by(BLK).map(move |i| {
            let bl = BLK.min(n - i);
            Block {
                b,
                i0: off + i,
                t0: lo + i,
                bl,
                t1: lo + i + bl,
            }
        })
    })
}

/// Scaled scores of block `k` into `p` (row stride `t1 + s`): the GEMM against the step-0
/// keys, then the chain keys.
fn scores(p: &mut [f32], qh: &[f32], kh: &[f32], g: &Geom<'_>, k: &Block) {
    let (hd, s) = (g.hd, g.s);
    let wd = k.t1 + s;
    let k0 = g.plan.row(0, k.b, 0);
    gemm_into(
        p,
        wd,
        k.bl,
        k.t1,
        hd,
        Mat::rm(&qh[k.i0 * hd..], hd),
        Mat::rm_t(&kh[k0 * hd..], hd),
        g.scale(),
        false,
    );
    for ii in 0..k.bl {
        let qi = &qh[(k.i0 + ii) * hd..][..hd];
        for sp in 1..=s {
            let kr = g.plan.row(sp, k.b, k.t0 + ii);
            p[ii * wd + k.t1 + sp - 1] = g.scale() * dot(qi, &kh[kr * hd..][..hd]);
        }
    }
}

/// Forward: `out` (`[heads][N_s][hd]`) and `lse` (`[heads][N_s]`) from the step's queries
/// `q` (`[heads][N_s][hd]`) and all keys / values `k`, `v` (`[kv][R][hd]`).
pub(crate) fn forward(
    out: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sc: &mut [f32],
    g: Geom<'_>,
) {
    let (ns, hd, r) = (g.plan.step_rows(g.s), g.hd, g.plan.r());
    let grp = g.nh / g.kv;
    if ns == 0 {
        return;
    }
    out.par_chunks_mut(grp * ns * hd)
        .zip(lse.par_chunks_mut(grp * ns))
        .zip(sc.par_chunks_mut(2 * BLK * g.w))
        .enumerate()
        .for_each(|(kvh, ((out_g, lse_g), scr))| {
            let kh = &k[kvh * r * hd..(kvh + 1) * r * hd];
            let vh = &v[kvh * r * hd..(kvh + 1) * r * hd];
            for j in 0..grp {
                let h = kvh * grp + j;
                let qh = &q[h * ns * hd..(h + 1) * ns * hd];
                let oh = &mut out_g[j * ns * hd..(j + 1) * ns * hd];
                let lh = &mut lse_g[j * ns..(j + 1) * ns];
                for blk in blocks(g.plan, g.s) {
                    let wd = blk.t1 + g.s;
                    let p = &mut scr[..blk.bl * wd];
                    scores(p, qh, kh, &g, &blk);
                    for (ii, row) in p.chunks_exact_mut(wd).enumerate() {
                        let t = blk.t0 + ii;
                        let (live, chain) = row.split_at_mut(blk.t1);
                        let mx = live[..=t]
                            .iter()
                            .chain(chain.iter())
                            .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                        let mut sum = 0.0;
                        for x in live[..=t].iter_mut().chain(chain.iter_mut()) {
                            *x = (*x - mx).exp();
                            sum += *x;
                        }
                        let inv = 1.0 / sum;
                        for x in live[..=t].iter_mut().chain(chain.iter_mut()) {
                            *x *= inv;
                        }
                        live[t + 1..].fill(0.0);
                        lh[blk.i0 + ii] = mx + sum.ln();
                    }
                    let k0 = g.plan.row(0, blk.b, 0);
                    gemm_into(
                        &mut oh[blk.i0 * hd..],
                        hd,
                        blk.bl,
                        hd,
                        blk.t1,
                        Mat::rm(p, wd),
                        Mat::rm(&vh[k0 * hd..], hd),
                        1.0,
                        false,
                    );
                    for ii in 0..blk.bl {
                        let oi = &mut oh[(blk.i0 + ii) * hd..][..hd];
                        for sp in 1..=g.s {
                            let vr = g.plan.row(sp, blk.b, blk.t0 + ii);
                            axpy(oi, p[ii * wd + blk.t1 + sp - 1], &vh[vr * hd..][..hd]);
                        }
                    }
                }
            }
        });
}

/// Backward: writes `dq` (`[heads][N_s][hd]`) and ADDS into `dk`, `dv` (`[kv][R][hd]`) from
/// `dout` (`[heads][N_s][hd]`), the saved queries, keys, values and `lse`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    lse: &[f32],
    sc: &mut [f32],
    g: Geom<'_>,
) {
    let (ns, hd, r) = (g.plan.step_rows(g.s), g.hd, g.plan.r());
    let grp = g.nh / g.kv;
    if ns == 0 {
        return;
    }
    let scale = g.scale();
    dq.par_chunks_mut(grp * ns * hd)
        .zip(dk.par_chunks_mut(r * hd).zip(dv.par_chunks_mut(r * hd)))
        .zip(sc.par_chunks_mut(2 * BLK * g.w))
        .enumerate()
        .for_each(|(kvh, ((dq_g, (dkh, dvh)), scr))| {
            let kh = &k[kvh * r * hd..(kvh + 1) * r * hd];
            let vh = &v[kvh * r * hd..(kvh + 1) * r * hd];
            let (p, dp) = scr.split_at_mut(BLK * g.w);
            for j in 0..grp {
                let h = kvh * grp + j;
                let qh = &q[h * ns * hd..(h + 1) * ns * hd];
                let doh = &dout[h * ns * hd..(h + 1) * ns * hd];
                let lh = &lse[h * ns..(h + 1) * ns];
                let dqh = &mut dq_g[j * ns * hd..(j + 1) * ns * hd];
                for blk in blocks(g.plan, g.s) {
                    let (wd, t1, bl) = (blk.t1 + g.s, blk.t1, blk.bl);
                    let k0 = g.plan.row(0, blk.b, 0);
                    let p = &mut p[..bl * wd];
                    let dp = &mut dp[..bl * wd];
                    scores(p, qh, kh, &g, &blk);
                    for (ii, row) in p.chunks_exact_mut(wd).enumerate() {
                        let t = blk.t0 + ii;
                        let l = lh[blk.i0 + ii];
                        let (live, chain) = row.split_at_mut(t1);
                        for x in live[..=t].iter_mut().chain(chain.iter_mut()) {
                            *x = (*x - l).exp();
                        }
                        live[t + 1..].fill(0.0);
                    }
                    let do_blk = &doh[blk.i0 * hd..];
                    // dV += Pᵀ dO (step-0 keys), p · dO (chain keys).
                    let pt = Mat {
                        data: p,
                        rs: 1,
                        cs: wd,
                    };
                    let (dk0, dv0) = (&mut dkh[k0 * hd..], &mut dvh[k0 * hd..]);
                    gemm_into(dv0, hd, t1, hd, bl, pt, Mat::rm(do_blk, hd), 1.0, true);
                    // dP = dO Vᵀ.
                    let vt = Mat::rm_t(&vh[k0 * hd..], hd);
                    gemm_into(dp, wd, bl, t1, hd, Mat::rm(do_blk, hd), vt, 1.0, false);
                    for ii in 0..bl {
                        let di = &doh[(blk.i0 + ii) * hd..][..hd];
                        for sp in 1..=g.s {
                            let vr = g.plan.row(sp, blk.b, blk.t0 + ii);
                            let c = ii * wd + t1 + sp - 1;
                            axpy(&mut dvh[vr * hd..][..hd], p[c], di);
                            dp[c] = dot(di, &vh[vr * hd..][..hd]);
                        }
                    }
                    // dS = P ⊙ (dP − Σ P ⊙ dP), into p (zero where masked).
                    for (prow, dprow) in p.chunks_exact_mut(wd).zip(dp.chunks_exact(wd)) {
                        let d: f32 = prow.iter().zip(dprow.iter()).map(|(a, b)| a * b).sum();
                        prow.iter_mut()
                            .zip(dprow.iter())
                            .for_each(|(x, dpv)| *x *= dpv - d);
                    }
                    // dQ = scale · dS K ; dK += scale · dSᵀ Q.
                    let q_blk = Mat::rm(&qh[blk.i0 * hd..], hd);
                    let kk = Mat::rm(&kh[k0 * hd..], hd);
                    let dq_blk = &mut dqh[blk.i0 * hd..];
                    gemm_into(dq_blk, hd, bl, hd, t1, Mat::rm(p, wd), kk, scale, false);
                    let pt = Mat {
                        data: p,
                        rs: 1,
                        cs: wd,
                    };
                    gemm_into(dk0, hd, t1, hd, bl, pt, q_blk, scale, true);
                    for ii in 0..bl {
                        let qi = &qh[(blk.i0 + ii) * hd..][..hd];
                        for sp in 1..=g.s {
                            let kr = g.plan.row(sp, blk.b, blk.t0 + ii);
                            let ds = scale * p[ii * wd + t1 + sp - 1];
                            axpy(
                                &mut dqh[(blk.i0 + ii) * hd..][..hd],
                                ds,
                                &kh[kr * hd..][..hd],
                            );
                            axpy(&mut dkh[kr * hd..][..hd], ds, qi);
                        }
                    }
                }
            }
        });
}

#[cfg(test)]
#[path = "attn_tests.rs"]
mod tests;
