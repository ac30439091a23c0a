//! ABI train batches → the core's right-padded token-aligned `[B, T]` arrays, and back.

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{PluginError, RVec, TrainSequence};

/// A padded batch: tokens, response mask and the per-sequence `(prompt_len, len)`.
pub struct Padded {
    /// Token ids `[b·t]` (right padding with 0).
    pub tokens: Vec<u32>,
    /// 1 on completion tokens (as targets), else 0.
    pub mask: Vec<f32>,
    /// Sequences.
    pub b: usize,
    /// Padded length.
    pub t: usize,
    /// `(prompt_len, len)` per sequence.
    pub spans: Vec<(usize, usize)>,
}

impl Padded {
    /// Pads `seqs`; every sequence needs `1 <= prompt_len <= len`.
    pub fn new(seqs: &[TrainSequence], vocab: usize) -> Result<Self> {
        if seqs.is_empty() {
            return Err(PluginError::invalid_input("train batch has no sequences"));
        }
        let t = seqs.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        let b = seqs.len();
        let mut tokens = vec![0u32; b * t];
        let mut mask = vec![0f32; b * t];
        let mut spans = Vec::with_capacity(b);
        for (i, s) in seqs.iter().enumerate() {
            let (p, n) = (s.prompt_len as usize, s.tokens.len());
            if p == 0 || p > n {
                return Err(PluginError::invalid_input(format!(
                    "sequence {i}: prompt_len {p} must be in 1..={n} (the first token has no \
                     logprob)"
                )));
            }
            if let Some(bad) = s.tokens.iter().find(|&&x| x as usize >= vocab) {
                return Err(PluginError::invalid_input(format!(
                    "sequence {i}: token id {bad} is out of range for vocab_size {vocab}"
                )));
            }
            tokens[i * t..i * t + n].copy_from_slice(&s.tokens);
            mask[i * t + p..i * t + n].fill(1.0);
            spans.push((p, n));
        }
        Ok(Padded {
            tokens,
            mask,
            b,
            t,
            spans,
        })
    }

    /// The core's view of this batch.
    pub fn batch(&self) -> tandem_native_core::trainer::Batch<'_> {
        tandem_native_core::trainer::Batch {
            tokens: &self.tokens,
            b: self.b,
            t: self.t,
            mask: &self.mask,
        }
    }

    /// Completion slices of a token-aligned `[b·t]` array, one vector per sequence.
    pub fn completions(&self, aligned: &[f32]) -> Vec<Vec<f32>> {
        self.spans
            .iter()
            .enumerate()
            .map(|(i, &(p, n))| aligned[i * self.t + p..i * self.t + n].to_vec())
            .collect()
    }

    /// Scatters per-sequence completion values (`pick(seq)`, each of the completion's length)
    /// into a token-aligned array; `None` if a sequence's list is empty.
    pub fn scatter(
        &self,
        seqs: &[TrainSequence],
        what: &str,
        pick: impl Fn(&TrainSequence) -> &[f32],
    ) -> Result<Option<Vec<f32>>> {
        let mut out = vec![0f32; self.b * self.t];
        for (i, (s, &(p, n))) in seqs.iter().zip(&self.spans).enumerate() {
            let v = pick(s);
            if v.is_empty() {
                return Ok(None);
            }
            if v.len() != n - p {
                return Err(PluginError::invalid_input(format!(
                    "sequence {i}: {} {what} for {} completion tokens",
                    v.len(),
                    n - p
                )));
            }
            out[i * self.t + p..i * self.t + n].copy_from_slice(v);
        }
        Ok(Some(out))
    }

    /// Scatters per-sequence rows (one per sequence, each of its completion's length) into a
    /// token-aligned array (0 off the completions); `what` names the rows in errors.
    pub fn scatter_rows(&self, rows: &[RVec<f32>], what: &str) -> Result<Vec<f32>> {
        if rows.len() != self.b {
            return Err(PluginError::invalid_input(format!(
                "{} rows of {what} for a batch of {} sequences (one row per sequence)",
                rows.len(),
                self.b
            )));
        }
        let mut out = vec![0f32; self.b * self.t];
        for (i, (row, &(p, n))) in rows.iter().zip(&self.spans).enumerate() {
            if row.len() != n - p {
                return Err(PluginError::invalid_input(format!(
                    "sequence {i}: {} {what} for {} completion tokens",
                    row.len(),
                    n - p
                )));
            }
            if let Some(x) = row.iter().find(|x| !x.is_finite()) {
                return Err(PluginError::invalid_input(format!(
                    "sequence {i}: {what} holds {x} (every entry must be finite)"
                )));
            }
            out[i * self.t + p..i * self.t + n].copy_from_slice(row);
        }
        Ok(out)
    }
}
