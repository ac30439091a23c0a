//! Rotary position embedding in Hugging Face's rotate-half layout: for a head vector `x` of
//! width `hd` and `i < hd/2`, `x'[i] = x[i]·cos − x[i+hd/2]·sin`,
//! `x'[i+hd/2] = x[i+hd/2]·cos + x[i]·sin`, angle `pos · theta^(−2i/hd)`.

/// Precomputed cos/sin per (position, frequency).
#[derive(Debug, Clone)]
pub struct RopeTable {
    half: usize,
    max_pos: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// Table for positions `0..max_pos` of heads of width `head_dim`.
    pub fn new(head_dim: usize, theta: f64, max_pos: usize) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        // Same arithmetic order as transformers (f32 inv_freq, f32 product) for parity.
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / (theta.powf((2 * i) as f64 / head_dim as f64) as f32))
            .collect();
        for p in 0..max_pos {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        RopeTable {
            half,
            max_pos,
            cos,
            sin,
        }
    }

    /// Largest supported position + 1.
    pub fn max_pos(&self) -> usize {
        self.max_pos
    }

    /// Rotates one head vector in place for position `pos` (forward).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        self.rotate(x, pos, 1.0);
    }

    /// Backward of [`apply`](Self::apply): rotates a gradient by the opposite angle.
    pub fn apply_backward(&self, dx: &mut [f32], pos: usize) {
        self.rotate(dx, pos, -1.0);
    }

    fn rotate(&self, x: &mut [f32], pos: usize, sign: f32) {
        let h = self.half;
        let c = &self.cos[pos * h..(pos + 1) * h];
        let s = &self.sin[pos * h..(pos + 1) * h];
        let (a, b) = x.split_at_mut(h);
        for i in 0..h {
            let (x1, x2) = (a[i], b[i]);
            let sn = sign * s[i];
            a[i] = x1 * c[i] - x2 * sn;
            b[i] = x2 * c[i] + x1 * sn;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check, seq};

    #[test]
    fn rope_backward_matches_finite_differences_and_is_inverse() {
        let t = RopeTable::new(8, 10000.0, 16);
        let x0 = seq(8, 1.0, 3);
        let r = seq(8, 1.0, 4);
        let f = |x: &[f32]| {
            let mut y = x.to_vec();
            t.apply(&mut y, 5);
            y.iter()
                .zip(&r)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>()
        };
        let mut g = r.clone();
        t.apply_backward(&mut g, 5);
        check("rope", &x0, &g, f);
        let mut y = x0.clone();
        t.apply(&mut y, 7);
        t.apply_backward(&mut y, 7);
        for (a, b) in y.iter().zip(&x0) {
            assert!((a - b).abs() < 1e-6);
        }
        // Position 0 is the identity.
        let mut z = x0.clone();
        t.apply(&mut z, 0);
        assert_eq!(z, x0);
    }
}
