//! RMSNorm (Hugging Face `LlamaRMSNorm`): `y = w ⊙ x / sqrt(mean(x²) + eps)` per row.

/// Forward over rows of width `w.len()`; writes `y` and the per-row inverse RMS `rstd`.
pub fn rmsnorm(y: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let d = w.len();
    for ((yr, r), xr) in y
        .chunks_exact_mut(d)
        .zip(rstd.iter_mut())
        .zip(x.chunks_exact(d))
    {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        *r = inv;
        for ((o, xv), wv) in yr.iter_mut().zip(xr).zip(w) {
            *o = wv * (xv * inv);
        }
    }
}

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
    for ((dxr, (dyr, xr)), &r) in dx
        .chunks_exact_mut(d)
        .zip(dy.chunks_exact(d).zip(x.chunks_exact(d)))
        .zip(rstd)
    {
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
