//! Micro-batches of a step: whole sequences, sorted by length, grouped under a token and a
//! sequence limit, each trimmed to its longest loss position (no work on trailing padding),
//! and the statistics of the parts added back into the whole batch's.
//!
//! A sequence is never split (the sequence-level ratio and sequence-mean need whole
//! sequences); one longer than the token limit is a micro-batch of its own. A sequence
//! without loss positions is skipped: it adds nothing to the loss or the gradients (its
//! logprobs are 0, and the whole batch's normaliser still counts it).

use super::Batch;
use crate::loss::{Loss, LossStats};

/// Limits of one micro-batch (padded tokens, sequences); the default is one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroBatch {
    /// Most padded tokens (sequences × the longest of them) per micro-batch.
    pub tokens: usize,
    /// Most sequences per micro-batch.
    pub sequences: usize,
}

impl Default for MicroBatch {
    fn default() -> Self {
        MicroBatch {
            tokens: usize::MAX,
            sequences: usize::MAX,
        }
    }
}

/// One micro-batch: sequence indices of the batch and their trimmed length.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Micro {
    pub seqs: Vec<usize>,
    pub t: usize,
}

/// The micro-batches of `batch` under `limit`.
pub(super) fn plan(batch: &Batch<'_>, limit: &MicroBatch) -> Vec<Micro> {
    let t = batch.t;
    // Length up to the last counted token (the positions after it change nothing).
    let mut lens: Vec<(usize, usize)> = (0..batch.b)
        .filter_map(|s| {
            let row = &batch.mask[s * t..(s + 1) * t];
            (1..t).rev().find(|&j| row[j] != 0.0).map(|j| (s, j + 1))
        })
        .collect();
    lens.sort_by_key(|&(_, len)| len);
    let mut out: Vec<Micro> = Vec::new();
    let mut cur = Micro {
        seqs: Vec::new(),
        t: 0,
    };
    for (s, len) in lens {
        let k = cur.seqs.len() + 1;
        if !cur.seqs.is_empty()
            && (k.saturating_mul(len.max(cur.t)) > limit.tokens || k > limit.sequences)
        {
            out.push(std::mem::replace(
                &mut cur,
                Micro {
                    seqs: Vec::new(),
                    t: 0,
                },
            ));
        }
        cur.seqs.push(s);
        cur.t = cur.t.max(len);
    }
    if !cur.seqs.is_empty() {
        out.push(cur);
    }
    out
}

/// Rows `seqs` of a `[B, t]` array, each cut to `mt` entries.
fn rows<T: Copy>(src: &[T], t: usize, seqs: &[usize], mt: usize) -> Vec<T> {
    seqs.iter()
        .flat_map(|&s| src[s * t..s * t + mt].iter().copied())
        .collect()
}

/// The owned arrays of one micro-batch.
pub(super) struct Part {
    tokens: Vec<u32>,
    mask: Vec<f32>,
    b: usize,
    t: usize,
    adv: Vec<f32>,
    old: Vec<f32>,
    refs: Option<Vec<f32>>,
}

impl Micro {
    /// Gathers this micro-batch's rows of `batch` and of `loss`'s per-token inputs.
    pub fn part(&self, batch: &Batch<'_>, loss: &Loss<'_>) -> Part {
        let (t, mt, s) = (batch.t, self.t, &self.seqs[..]);
        let (adv, old, refs) = match loss {
            Loss::Policy {
                advantages,
                old_logprobs,
                ref_logprobs,
                ..
            } => (
                rows(advantages, t, s, mt),
                rows(old_logprobs, t, s, mt),
                ref_logprobs.map(|r| rows(r, t, s, mt)),
            ),
            Loss::Sft => (Vec::new(), Vec::new(), None),
        };
        Part {
            tokens: rows(batch.tokens, t, s, mt),
            mask: rows(batch.mask, t, s, mt),
            b: s.len(),
            t: mt,
            adv,
            old,
            refs,
        }
    }

    /// Writes a micro-batch's token-aligned values back into the whole batch's `[B, t]`.
    pub fn scatter(&self, part: &[f32], t: usize, whole: &mut [f32]) {
        for (k, &s) in self.seqs.iter().enumerate() {
            whole[s * t..s * t + self.t].copy_from_slice(&part[k * self.t..(k + 1) * self.t]);
        }
    }
}

impl Part {
    /// The core's view of the micro-batch.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            b: self.b,
            t: self.t,
            mask: &self.mask,
        }
    }

    /// `loss` over the micro-batch's rows.
    pub fn loss<'p>(&'p self, loss: &Loss<'_>) -> Loss<'p> {
        match loss {
            Loss::Sft => Loss::Sft,
            Loss::Policy { cfg, .. } => Loss::Policy {
                cfg: *cfg,
                advantages: &self.adv,
                old_logprobs: &self.old,
                ref_logprobs: self.refs.as_deref(),
            },
        }
    }
}

/// The whole batch's statistics from its parts' (each normalised by the whole batch's
/// normaliser: the losses add up; the means are weighted by the counted tokens).
#[derive(Debug, Default)]
pub(super) struct StatSums {
    loss: f64,
    tokens: f64,
    kl: f64,
    clip: f64,
    nll: f64,
}

impl StatSums {
    pub fn add(&mut self, s: &LossStats) {
        self.loss += s.loss;
        self.tokens += s.tokens;
        self.kl += s.kl * s.tokens;
        self.clip += s.clip_frac * s.tokens;
        self.nll += s.nll * s.tokens;
    }

    pub fn stats(&self) -> LossStats {
        let tok = self.tokens.max(1e-12);
        LossStats {
            loss: self.loss,
            tokens: self.tokens,
            kl: self.kl / tok,
            clip_frac: self.clip / tok,
            nll: self.nll / tok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_groups_sorted_sequences_under_the_limits() {
        // 4 sequences of t = 6; loss positions end at 5, 2, none, 4 (lengths 6, 3, -, 5).
        let mut mask = vec![0f32; 24];
        mask[5] = 1.0;
        mask[6 + 2] = 1.0;
        mask[18 + 3] = 1.0;
        mask[18 + 4] = 1.0;
        let tokens = vec![1u32; 24];
        let batch = Batch {
            tokens: &tokens,
            b: 4,
            t: 6,
            mask: &mask,
        };
        let all = plan(&batch, &MicroBatch::default());
        assert_eq!(
            all,
            vec![Micro {
                seqs: vec![1, 3, 0],
                t: 6
            }]
        );
        let lim = MicroBatch {
            tokens: 9,
            sequences: 8,
        };
        assert_eq!(
            plan(&batch, &lim),
            vec![
                Micro {
                    seqs: vec![1],
                    t: 3
                },
                Micro {
                    seqs: vec![3],
                    t: 5
                },
                Micro {
                    seqs: vec![0],
                    t: 6
                }
            ]
        );
        let two = MicroBatch {
            tokens: usize::MAX,
            sequences: 2,
        };
        assert_eq!(plan(&batch, &two).len(), 2);
        let m = &all[0];
        let part = m.part(&batch, &Loss::Sft);
        assert_eq!(part.batch().b, 3);
        let mut whole = vec![0f32; 24];
        m.scatter(&part.mask, 6, &mut whole);
        assert_eq!(whole, mask);
    }
}
