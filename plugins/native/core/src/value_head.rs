//! The scalar value head of a PPO critic over the decoder: `v = h · w + b`, with `h` the
//! final RMS-normed hidden state of a position (saved by the training forward at
//! [`crate::acts::ActLayout::hidden_offset`]). Its parameters `[w (d), b]`, gradients and
//! AdamW moments are provider buffers (tags `weights`, `grads`, `optimizer`), so snapshots,
//! offload and the memory ledger cover them like the body's. Zero-initialised: a fresh head
//! values every state 0, deterministically.
//!
//! Position `r` of a sequence values the state that emits token `r + 1`: in the token-aligned
//! arrays of [`crate::value`] its value sits at entry `r + 1` ([`ValueHead::aligned`]).

use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::error::{NativeError, Result};

/// Parameters `[w, b]`, gradients and AdamW moments of the head.
pub struct ValueHead {
    d: usize,
    params: Box<dyn Region>,
    grads: Box<dyn Region>,
    m: Box<dyn Region>,
    v: Box<dyn Region>,
}

impl ValueHead {
    /// A zero head over hidden size `d`.
    pub fn new(d: usize, provider: &mut dyn BufferProvider) -> Result<Self> {
        if d == 0 {
            return Err(NativeError::Input(
                "a value head needs a hidden size > 0".into(),
            ));
        }
        Ok(ValueHead {
            d,
            params: provider.alloc(BufferTag::Weights, "value_head/params", d + 1)?,
            grads: provider.alloc(BufferTag::Grads, "value_head/grads", d + 1)?,
            m: provider.alloc(BufferTag::Optimizer, "value_head/m", d + 1)?,
            v: provider.alloc(BufferTag::Optimizer, "value_head/v", d + 1)?,
        })
    }

    /// Hidden size.
    pub fn hidden(&self) -> usize {
        self.d
    }
    /// `[w (d), b]`.
    pub fn params(&self) -> &[f32] {
        self.params.as_slice()
    }
    /// `[w (d), b]`, writable.
    pub fn params_mut(&mut self) -> &mut [f32] {
        self.params.as_mut_slice()
    }
    /// Gradients (parameter layout).
    pub fn grads(&self) -> &[f32] {
        self.grads.as_slice()
    }
    /// Gradients, writable.
    pub fn grads_mut(&mut self) -> &mut [f32] {
        self.grads.as_mut_slice()
    }
    /// AdamW moments `(m, v)`.
    pub fn moments(&self) -> (&[f32], &[f32]) {
        (self.m.as_slice(), self.v.as_slice())
    }
    /// `(params, grads, m, v)`, writable (the optimizer step).
    pub fn parts_mut(&mut self) -> (&mut [f32], &mut [f32], &mut [f32], &mut [f32]) {
        (
            self.params.as_mut_slice(),
            self.grads.as_mut_slice(),
            self.m.as_mut_slice(),
            self.v.as_mut_slice(),
        )
    }

    /// The value of every position of `hidden` (`[N, d]`), in position order.
    pub fn forward(&self, hidden: &[f32]) -> Vec<f32> {
        let (w, b) = self.params().split_at(self.d);
        hidden
            .chunks_exact(self.d)
            .map(|h| dot(h, w) + b[0])
            .collect()
    }

    /// Position values (`[B, T]`) → token-aligned values: entry `j` of a row is position
    /// `j − 1`'s value, entry 0 is 0.
    pub fn aligned(positions: &[f32], t: usize) -> Vec<f32> {
        let mut out = vec![0f32; positions.len()];
        for (o, p) in out.chunks_exact_mut(t).zip(positions.chunks_exact(t)) {
            o[1..].copy_from_slice(&p[..t - 1]);
        }
        out
    }

    /// Backward of [`forward`](Self::forward) from token-aligned `∂L/∂v` (`[B, T]`):
    /// accumulates the head's gradients and writes `∂L/∂h` (`[N, d]`) into `dh`.
    pub fn backward(&mut self, hidden: &[f32], dvalues: &[f32], t: usize, dh: &mut [f32]) {
        let d = self.d;
        let (w, _) = self.params.as_slice().split_at(d);
        let mut gw = vec![0f32; d];
        let mut gb = 0f32;
        for (r, (h, dhr)) in hidden
            .chunks_exact(d)
            .zip(dh.chunks_exact_mut(d))
            .enumerate()
        {
            // Position r is valued at aligned entry r + 1 of its row; the last has none.
            let g = if (r + 1) % t == 0 {
                0.0
            } else {
                dvalues[r + 1]
            };
            for ((o, &wi), (gwi, &hi)) in dhr.iter_mut().zip(w).zip(gw.iter_mut().zip(h)) {
                *o = g * wi;
                *gwi += g * hi;
            }
            gb += g;
        }
        let grads = self.grads.as_mut_slice();
        for (a, g) in grads.iter_mut().zip(gw) {
            *a += g;
        }
        grads[d] += gb;
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum::<f64>() as f32
}
