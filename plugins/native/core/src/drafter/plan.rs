//! Row bookkeeping and activation layout of one TTT batch.
//!
//! A *row* is one query `(s, b, t)`: step `s`, sequence `b`, position `t`; it reads token
//! `x_{t+s+1}` at RoPE position `t + s` and predicts `x_{t+s+2}`. Step 0 has the rows
//! `t = 0 .. T−2` (every position with a label: they are also the keys all steps attend);
//! steps `s ≥ 1` only the rows `lo ≤ t < T−2−s` whose chain can still reach a label in the
//! loss mask (`lo = prompt_len − S − 1`, saturating; no row when no label is in the mask).
//! Rows are numbered globally step-major, then by sequence, then by position.
//!
//! [`Acts`] splits the `activations` buffer: per row what backward needs (`q`, `lse` in
//! per-step head-major sections `[heads][N_s][hd]` / `[heads][N_s]`; `k`, `v` and their
//! gradients head-major over ALL rows `[kv][R][hd]`, so one kv head's keys of every step are
//! contiguous), then per-step scratch, the lm_head chunk buffers and the attention scratch.

use super::config::DrafterConfig;
use crate::error::{NativeError, Result};

/// Query rows per attention block (rows of the score scratch).
pub(crate) const BLK: usize = 32;
/// Rows per lm_head chunk (logits scratch `[HEAD_CHUNK, draft_vocab]`).
pub(crate) const HEAD_CHUNK: usize = 128;

/// Rows of one TTT batch.
#[derive(Debug, Default, Clone)]
pub(crate) struct Plan {
    /// Steps `S`.
    pub steps: usize,
    /// Sequence lengths `T_b`.
    pub lens: Vec<usize>,
    /// Loss-mask start per sequence (labels at index ≥ it count).
    pub prompt: Vec<usize>,
    lo: Vec<usize>,
    n: Vec<usize>,
    seq_off: Vec<usize>,
    /// First global row of each step, and `R` at the end (`S + 1` entries).
    pub step_off: Vec<usize>,
    /// `(b, t)` of every global row.
    pub rows: Vec<(u32, u32)>,
}

impl Plan {
    /// Rebuilds the plan for sequences of `(length, prompt_len)` and `steps` steps (vectors
    /// reused: no allocation once they reached the largest batch).
    pub fn build(&mut self, seqs: impl Iterator<Item = (usize, usize)>, steps: usize) {
        self.steps = steps;
        self.lens.clear();
        self.prompt.clear();
        for (len, p) in seqs {
            self.lens.push(len);
            self.prompt.push(p);
        }
        let nb = self.lens.len();
        self.lo.clear();
        for b in 0..nb {
            let (len, p) = (self.lens[b], self.prompt[b]);
            self.lo.push(if p < len {
                p.saturating_sub(steps + 1)
            } else {
                len
            });
        }
        self.n.clear();
        self.seq_off.clear();
        self.step_off.clear();
        self.rows.clear();
        for s in 0..steps {
            self.step_off.push(self.rows.len());
            let base = self.rows.len();
            for b in 0..nb {
                self.seq_off.push(self.rows.len() - base);
                let end = self.lens[b].saturating_sub(2 + s);
                let lo = if s == 0 { 0 } else { self.lo[b].min(end) };
                self.n.push(end - lo);
                for t in lo..end {
                    self.rows.push((b as u32, t as u32));
                }
            }
        }
        self.step_off.push(self.rows.len());
    }

    /// Number of sequences.
    pub fn nseq(&self) -> usize {
        self.lens.len()
    }
    /// Total rows `R`.
    pub fn r(&self) -> usize {
        self.rows.len()
    }
    /// Rows of step `s`.
    pub fn step_rows(&self, s: usize) -> usize {
        self.step_off[s + 1] - self.step_off[s]
    }
    /// Rows of sequence `b` at step `s`.
    pub fn n(&self, s: usize, b: usize) -> usize {
        self.n[s * self.nseq() + b]
    }
    /// First position of sequence `b`'s rows at step `s`.
    pub fn lo(&self, s: usize, b: usize) -> usize {
        if s == 0 { 0 } else { self.lo[b] }
    }
    /// Offset of sequence `b`'s rows within step `s`.
    pub fn seq_off(&self, s: usize, b: usize) -> usize {
        self.seq_off[s * self.nseq() + b]
    }
    /// Global row of `(s, b, t)` (which must exist).
    pub fn row(&self, s: usize, b: usize, t: usize) -> usize {
        self.step_off[s] + self.seq_off(s, b) + t - self.lo(s, b)
    }
    /// Global row of `(s, b, t)`, if that query exists.
    pub fn find(&self, s: usize, b: usize, t: usize) -> Option<usize> {
        let lo = self.lo(s, b);
        (s < self.steps && b < self.nseq() && t >= lo && t - lo < self.n(s, b))
            .then(|| self.row(s, b, t))
    }
    /// Largest rows of one step.
    pub fn max_step_rows(&self) -> usize {
        (0..self.steps)
            .map(|s| self.step_rows(s))
            .max()
            .unwrap_or(0)
    }
    /// Longest sequence.
    pub fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }
}

/// Sizes behind [`Acts`]: `r` rows, `n` rows per step, attention row width `w`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Dims {
    pub r: usize,
    pub n: usize,
    pub w: usize,
}

/// Named pieces of the activations buffer.
pub(crate) struct Acts<'a> {
    pub g: &'a mut [f32],
    pub re: &'a mut [f32],
    pub rg: &'a mut [f32],
    pub xcat: &'a mut [f32],
    pub q: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub lse: &'a mut [f32],
    pub att: &'a mut [f32],
    pub m: &'a mut [f32],
    pub r2: &'a mut [f32],
    pub h2: &'a mut [f32],
    pub gate: &'a mut [f32],
    pub up: &'a mut [f32],
    pub act: &'a mut [f32],
    pub y: &'a mut [f32],
    pub rf: &'a mut [f32],
    pub hf: &'a mut [f32],
    pub dy: &'a mut [f32],
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
    pub e: &'a mut [f32],
    pub a: &'a mut [f32],
    pub tq: &'a mut [f32],
    pub tk: &'a mut [f32],
    pub tv: &'a mut [f32],
    pub hq: &'a mut [f32],
    pub dq: &'a mut [f32],
    pub d1: &'a mut [f32],
    pub d2: &'a mut [f32],
    pub f1: &'a mut [f32],
    pub f2: &'a mut [f32],
    pub f3: &'a mut [f32],
    pub logits: &'a mut [f32],
    pub hbuf: &'a mut [f32],
    pub dh: &'a mut [f32],
    pub sc: &'a mut [f32],
}

fn sizes(c: &DrafterConfig, d: Dims) -> [usize; 37] {
    let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let (r, n, nh) = (d.r, d.n, c.num_attention_heads);
    let sc = c.num_key_value_heads * 2 * BLK * d.w;
    let hc = HEAD_CHUNK;
    [
        r * h,
        r,
        r,
        r * 2 * h,
        r * qd,
        r * kvd,
        r * kvd,
        r * nh,
        r * qd,
        r * h,
        r,
        r * h,
        r * ff,
        r * ff,
        r * ff,
        r * h,
        r,
        r * h,
        r * h,
        r * kvd,
        r * kvd,
        n * h,
        n * h,
        n * qd,
        n * kvd,
        n * kvd,
        n * qd,
        n * qd,
        n * h,
        n * 2 * h,
        n * ff,
        n * ff,
        n * ff,
        hc * c.draft_vocab_size,
        hc * h,
        hc * h,
        sc,
    ]
}

/// f32 elements the activations buffer needs for `d`.
pub(crate) fn acts_len(c: &DrafterConfig, d: Dims) -> usize {
    sizes(c, d).iter().sum()
}

/// Splits `buf` into the named pieces for `d`.
pub(crate) fn split<'a>(c: &DrafterConfig, d: Dims, buf: &'a mut [f32]) -> Result<Acts<'a>> {
    let s = sizes(c, d);
    let total: usize = s.iter().sum();
    if buf.len() < total {
        return Err(NativeError::Buffer(format!(
            "drafter activations buffer has {} f32, this batch needs {total}",
            buf.len()
        )));
    }
    let mut rest = buf;
    let mut take = |n: usize| {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        head
    };
    Ok(Acts {
        g: take(s[0]),
        re: take(s[1]),
        rg: take(s[2]),
        xcat: take(s[3]),
        q: take(s[4]),
        k: take(s[5]),
        v: take(s[6]),
        lse: take(s[7]),
        att: take(s[8]),
        m: take(s[9]),
        r2: take(s[10]),
        h2: take(s[11]),
        gate: take(s[12]),
        up: take(s[13]),
        act: take(s[14]),
        y: take(s[15]),
        rf: take(s[16]),
        hf: take(s[17]),
        dy: take(s[18]),
        dk: take(s[19]),
        dv: take(s[20]),
        e: take(s[21]),
        a: take(s[22]),
        tq: take(s[23]),
        tk: take(s[24]),
        tv: take(s[25]),
        hq: take(s[26]),
        dq: take(s[27]),
        d1: take(s[28]),
        d2: take(s[29]),
        f1: take(s[30]),
        f2: take(s[31]),
        f3: take(s[32]),
        logits: take(s[33]),
        hbuf: take(s[34]),
        dh: take(s[35]),
        sc: take(s[36]),
    })
}
