//! SwiGLU gate: `a = silu(g) ⊙ u` with `silu(g) = g·σ(g)`.

use rayon::prelude::*;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Chunk size of the parallel loops.
const CHUNK: usize = 1 << 14;

/// Forward: `a[i] = silu(g[i]) · u[i]`.
pub fn swiglu(a: &mut [f32], g: &[f32], u: &[f32]) {
    let f = |(a, (g, u)): (&mut [f32], (&[f32], &[f32]))| {
        for ((o, &gv), &uv) in a.iter_mut().zip(g).zip(u) {
            *o = gv * sigmoid(gv) * uv;
        }
    };
    if a.len() > CHUNK {
        a.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(f);
    } else {
        f((a, (g, u)));
    }
}

/// Backward: writes `dg` and `du` from `da` and the saved `g`, `u`.
pub fn swiglu_backward(dg: &mut [f32], du: &mut [f32], da: &[f32], g: &[f32], u: &[f32]) {
    if da.len() > CHUNK {
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(
                da.par_chunks(CHUNK)
                    .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK))),
            )
            .for_each(|((dg, du), (da, (g, u)))| swiglu_backward_seq(dg, du, da, g, u));
    } else {
        swiglu_backward_seq(dg, du, da, g, u);
    }
}

fn swiglu_backward_seq(dg: &mut [f32], du: &mut [f32], da: &[f32], g: &[f32], u: &[f32]) {
    for ((((dgo, duo), &d), &gv), &uv) in dg.iter_mut().zip(du.iter_mut()).zip(da).zip(g).zip(u) {
        let s = sigmoid(gv);
        let silu = gv * s;
        *duo = d * silu;
        *dgo = d * uv * s * (1.0 + gv * (1.0 - s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check, seq};

    #[test]
    fn parallel_path_matches_sequential() {
        let n = 3 * CHUNK + 5;
        let g = seq(n, 3.0, 1);
        let u = seq(n, 1.0, 2);
        let da = seq(n, 1.0, 3);
        let mut a = vec![0.0; n];
        swiglu(&mut a, &g, &u);
        let (mut dg, mut du) = (vec![0.0; n], vec![0.0; n]);
        swiglu_backward(&mut dg, &mut du, &da, &g, &u);
        let (mut dg1, mut du1) = (vec![0.0; n], vec![0.0; n]);
        swiglu_backward_seq(&mut dg1, &mut du1, &da, &g, &u);
        assert_eq!((dg, du), (dg1, du1));
        let i = 2 * CHUNK + 3;
        assert_eq!(a[i], g[i] * sigmoid(g[i]) * u[i]);
    }

    #[test]
    fn swiglu_grads_match_finite_differences() {
        let n = 10;
        let g0 = seq(n, 3.0, 5);
        let u0 = seq(n, 1.0, 6);
        let r = seq(n, 1.0, 7);
        let f = |g: &[f32], u: &[f32]| {
            let mut a = vec![0.0; n];
            swiglu(&mut a, g, u);
            a.iter()
                .zip(&r)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>()
        };
        let mut dg = vec![0.0; n];
        let mut du = vec![0.0; n];
        swiglu_backward(&mut dg, &mut du, &r, &g0, &u0);
        check("swiglu dg", &g0, &dg, |g| f(g, &u0));
        check("swiglu du", &u0, &du, |u| f(&g0, u));
    }
}
