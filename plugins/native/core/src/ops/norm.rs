//! RMSNorm (Hugging Face `LlamaRMSNorm`): `y = w ⊙ x / sqrt(mean(x²) + eps)` per row.

use rayon::prelude::*;

/// Forward over rows of width `w.len()`; writes `y` and the per-row inverse RMS `rstd`.
pub fn rmsnorm(y: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let d = w.len();
    let row = |(yr, r, xr): (&mut [f32], &mut f32, &[f32])| {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        *r = inv;
        for ((o, xv), wv) in yr.iter_mut().zip(xr).zip(w) {
            *o = wv * (xv * inv);
        }
    };
    if x.len() >= PAR_MIN {
        y.par_chunks_exact_mut(d)
            .zip(rstd.par_iter_mut())
            .zip(x.par_chunks_exact(d))
            .with_min_len(16)
            .for_each(|((yr, r), xr)| row((yr, r, xr)));
    } else {
        for ((yr, r), xr) in y
            .chunks_exact_mut(d)
            .zip(rstd.iter_mut())
            .zip(x.chunks_exact(d))
        {
            row((yr, r, xr));
        }
    }
}

/// Elements above which row loops run in parallel.
const PAR_MIN: usize = 1 << 15;

/// Backward: `dx (+)= ∂L/∂x` and (if given) `dw += ∂L/∂w`, from `dy`, the input `x`, the
/// weight `w` and the `rstd` saved by the forward.
pub fn rmsnorm_backward(
    dx: &mut [f32],
    dw: Option<&mut [f32]>,
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    accumulate: bool,
) {
    let d = w.len();
    let row = |dxr: &mut [f32], dyr: &[f32], xr: &[f32], r: f32| {
        let dot: f32 = dyr
            .iter()
            .zip(w)
            .zip(xr)
            .map(|((g, wv), xv)| g * wv * xv)
            .sum();
        let c = r * r * r * dot / d as f32;
        for (((o, g), wv), xv) in dxr.iter_mut().zip(dyr).zip(w).zip(xr) {
            let v = r * wv * g - xv * c;
            if accumulate {
                *o += v;
            } else {
                *o = v;
            }
        }
    };
    if x.len() >= PAR_MIN {
        dx.par_chunks_exact_mut(d)
            .zip(dy.par_chunks_exact(d).zip(x.par_chunks_exact(d)))
            .zip(rstd.par_iter())
            .with_min_len(16)
            .for_each(|((dxr, (dyr, xr)), &r)| row(dxr, dyr, xr, r));
    } else {
        for ((dxr, (dyr, xr)), &r) in dx
            .chunks_exact_mut(d)
            .zip(dy.chunks_exact(d).zip(x.chunks_exact(d)))
            .zip(rstd)
        {
            row(dxr, dyr, xr, r);
        }
    }
    if let Some(dw) = dw {
        for ((dyr, xr), &r) in dy.chunks_exact(d).zip(x.chunks_exact(d)).zip(rstd) {
            for ((o, g), xv) in dw.iter_mut().zip(dyr).zip(xr) {
                *o += g * xv * r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check, seq};

    #[test]
    fn parallel_path_matches_row_formula() {
        let (rows, d) = (300, 128); // above PAR_MIN
        let x = seq(rows * d, 2.0, 8);
        let w = seq(d, 1.0, 9);
        let (mut y, mut s) = (vec![0.0; rows * d], vec![0.0; rows]);
        rmsnorm(&mut y, &mut s, &x, &w, 1e-6);
        for r in [0, 151, 299] {
            let xr = &x[r * d..(r + 1) * d];
            let inv = 1.0 / (xr.iter().map(|v| v * v).sum::<f32>() / d as f32 + 1e-6).sqrt();
            for j in 0..d {
                assert!((y[r * d + j] - w[j] * xr[j] * inv).abs() < 1e-5);
            }
        }
        // Backward, parallel vs a sequential evaluation on a single row.
        let dy = seq(rows * d, 1.0, 10);
        let mut dx = vec![0.0; rows * d];
        rmsnorm_backward(&mut dx, None, &dy, &x, &w, &s, false);
        let mut one = vec![0.0; d];
        rmsnorm_backward(
            &mut one,
            None,
            &dy[151 * d..152 * d],
            &x[151 * d..152 * d],
            &w,
            &s[151..152],
            false,
        );
        assert_eq!(&dx[151 * d..152 * d], &one[..]);
    }

    #[test]
    fn rmsnorm_grads_match_finite_differences() {
        let (rows, d) = (3, 6);
        let x0 = seq(rows * d, 1.0, 0);
        let w0 = seq(d, 0.5, 1);
        let r = seq(rows * d, 1.0, 2);
        let f = |x: &[f32], w: &[f32]| {
            let mut y = vec![0.0; rows * d];
            let mut s = vec![0.0; rows];
            rmsnorm(&mut y, &mut s, x, w, 1e-5);
            y.iter()
                .zip(&r)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>()
        };
        let mut y = vec![0.0; rows * d];
        let mut s = vec![0.0; rows];
        rmsnorm(&mut y, &mut s, &x0, &w0, 1e-5);
        let mut dx = vec![0.0; rows * d];
        let mut dw = vec![0.0; d];
        rmsnorm_backward(&mut dx, Some(&mut dw), &r, &x0, &w0, &s, false);
        check("rmsnorm dx", &x0, &dx, |x| f(x, &w0));
        check("rmsnorm dw", &w0, &dw, |w| f(&x0, w));
    }
}
