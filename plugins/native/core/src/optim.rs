//! AdamW (PyTorch semantics, decoupled weight decay) with moments in `optimizer` buffers,
//! and global-norm gradient clipping (PyTorch `clip_grad_norm_` semantics).

use rayon::prelude::*;

use crate::error::{NativeError, Result};

/// AdamW hyper-parameters and step counter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// β1.
    pub beta1: f32,
    /// β2.
    pub beta2: f32,
    /// ε.
    pub eps: f32,
    /// Decoupled weight decay (applied to every parameter).
    pub weight_decay: f32,
    /// Steps taken so far.
    pub step: u64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step: 0,
        }
    }
}

const CHUNK: usize = 1 << 14;

impl AdamW {
    /// One update: `p ← p − lr·(wd·p + m̂/(√v̂ + ε))` with bias-corrected moments.
    pub fn update(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) -> Result<()> {
        let n = params.len();
        if grads.len() != n || m.len() != n || v.len() != n {
            return Err(NativeError::Buffer(format!(
                "AdamW: params {n}, grads {}, m {}, v {} must have equal lengths",
                grads.len(),
                m.len(),
                v.len()
            )));
        }
        self.step += 1;
        let s = *self;
        let bc1 = 1.0 - (s.beta1 as f64).powi(s.step as i32);
        let bc2 = 1.0 - (s.beta2 as f64).powi(s.step as i32);
        let step_size = (s.lr as f64 / bc1) as f32;
        let bc2_sqrt = bc2.sqrt() as f32;
        let decay = 1.0 - s.lr * s.weight_decay;
        params
            .par_chunks_mut(CHUNK)
            .zip(grads.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
            .for_each(|((p, g), (m, v))| {
                for i in 0..p.len() {
                    let gi = g[i];
                    m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * gi;
                    v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * gi * gi;
                    let denom = v[i].sqrt() / bc2_sqrt + s.eps;
                    p[i] = p[i] * decay - step_size * m[i] / denom;
                }
            });
        Ok(())
    }
}

/// L2 norm of all gradients (f64 accumulation). Deterministic: each chunk's sum of squares
/// is computed in parallel, the chunk sums are added in order on one thread (a rayon `sum`
/// adds them in a tree whose shape depends on work stealing, so the last bits of the norm,
/// and through the clip the parameters, could differ from run to run).
pub fn grad_norm(grads: &[f32]) -> f64 {
    let partial: Vec<f64> = grads
        .par_chunks(CHUNK)
        .map(|c| c.iter().map(|&g| (g as f64) * (g as f64)).sum::<f64>())
        .collect();
    partial.iter().sum::<f64>().sqrt()
}

/// Scales gradients so their global norm is at most `max_norm`; returns the norm before
/// clipping. Non-finite norms are returned unchanged (caller should skip the step).
pub fn clip_grad_norm(grads: &mut [f32], max_norm: f32) -> f64 {
    let norm = grad_norm(grads);
    let coef = max_norm as f64 / (norm + 1e-6);
    if norm.is_finite() && coef < 1.0 {
        let c = coef as f32;
        grads.par_iter_mut().for_each(|g| *g *= c);
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adamw_first_step_matches_closed_form_and_clip_bounds_norm() {
        let mut opt = AdamW {
            lr: 0.1,
            weight_decay: 0.5,
            ..Default::default()
        };
        let mut p = vec![1.0f32, -2.0];
        let g = vec![0.5f32, -3.0];
        let (mut m, mut v) = (vec![0.0; 2], vec![0.0; 2]);
        opt.update(&mut p, &g, &mut m, &mut v).unwrap();
        // Step 1: m̂ = g, v̂ = g², so the update is lr·sign(g) (up to ε) plus decay.
        assert!((p[0] - (1.0 * (1.0 - 0.05) - 0.1)).abs() < 1e-5, "{p:?}");
        assert!((p[1] - (-2.0 * (1.0 - 0.05) + 0.1)).abs() < 1e-5, "{p:?}");
        let mut gs = vec![3.0f32, 4.0];
        let n = clip_grad_norm(&mut gs, 1.0);
        assert!((n - 5.0).abs() < 1e-9);
        assert!((grad_norm(&gs) - 1.0).abs() < 1e-5);
        let mut small = vec![0.3f32, 0.4];
        clip_grad_norm(&mut small, 1.0);
        assert_eq!(small, vec![0.3, 0.4]);
    }
}
