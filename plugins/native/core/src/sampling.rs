//! Seeded token sampling: temperature, top-k, top-p over one logits row, plus log-softmax.
//!
//! Logprobs reported to callers are ALWAYS of the sampled token under the unmodified
//! distribution `log_softmax(logits)` (temperature 1, no top-k/top-p truncation), so they
//! are comparable with the trainer's logprobs of the same token.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// Seeded generator (ChaCha8) with the few draws sampling needs.
#[derive(Debug, Clone)]
pub struct Rng(ChaCha8Rng);

impl Rng {
    /// A generator from a 64-bit seed.
    pub fn new(seed: u64) -> Self {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }
    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.0.next_u32() >> 8) as f32 / (1u32 << 24) as f32
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.next_f32() as f64).max(1e-12);
        let u2 = self.next_f32() as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// Sampling parameters of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p` (1.0 = off).
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Seed of this request's generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

/// `log Σ exp(logits)` of one row: the max in f32, the sum of `exp(x − max)` accumulated in
/// f64 (a sequential f32 sum over a 49k-token vocabulary drifts by ~1e-4 — more than
/// transformers' f32 `log_softmax` — and the result feeds every reported logprob).
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let s: f64 = logits.iter().map(|x| f64::from((x - m).exp())).sum();
    f64::from(m) + s.ln()
}

/// `log_softmax(logits)[token]` = `logit − log_sum_exp` rounded once to f32, exactly as the
/// loss computes it, so the engine's logprobs equal the trainer's bit for bit on the same
/// weights.
pub fn logprob_of(logits: &[f32], token: usize) -> f32 {
    (f64::from(logits[token]) - log_sum_exp(logits)) as f32
}

/// Index of the largest logit (first on ties).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

/// Samples a token id from one logits row; `scratch` is reused (no per-token allocation
/// once it has grown to the vocabulary size).
pub fn sample(
    logits: &[f32],
    p: &SamplingParams,
    rng: &mut Rng,
    scratch: &mut Vec<(f32, u32)>,
) -> usize {
    if p.temperature <= 0.0 {
        return argmax(logits);
    }
    let inv_t = 1.0 / p.temperature;
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    scratch.clear();
    scratch.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (((x - m) * inv_t).exp(), i as u32)),
    );
    let truncate = (p.top_k > 0 && p.top_k < logits.len()) || p.top_p < 1.0;
    if truncate {
        scratch.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        if p.top_k > 0 && p.top_k < scratch.len() {
            scratch.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let total: f32 = scratch.iter().map(|x| x.0).sum();
            let mut acc = 0.0;
            let mut keep = scratch.len();
            for (i, x) in scratch.iter().enumerate() {
                acc += x.0 / total;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            scratch.truncate(keep);
        }
    }
    let total: f32 = scratch.iter().map(|x| x.0).sum();
    let mut u = rng.next_f32() * total;
    for &(w, i) in scratch.iter() {
        if u < w {
            return i as usize;
        }
        u -= w;
    }
    scratch.last().map(|x| x.1 as usize).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_topk_and_seeds_behave() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        let mut s = Vec::new();
        let mut rng = Rng::new(1);
        let greedy = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(sample(&logits, &greedy, &mut rng, &mut s), 1);
        let top2 = SamplingParams {
            top_k: 2,
            ..Default::default()
        };
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[sample(&logits, &top2, &mut rng, &mut s)] += 1;
        }
        assert_eq!(
            seen[0] + seen[2],
            0,
            "top-k=2 kept only tokens 1 and 3: {seen:?}"
        );
        assert!(seen[1] > 100 && seen[3] > 100, "{seen:?}");
        let nucleus = SamplingParams {
            top_p: 0.3,
            ..Default::default()
        };
        for _ in 0..50 {
            assert_eq!(sample(&logits, &nucleus, &mut rng, &mut s), 1);
        }
        let draw = |seed| {
            let mut r = Rng::new(seed);
            (0..20)
                .map(|_| sample(&logits, &SamplingParams::default(), &mut r, &mut Vec::new()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let lp = logprob_of(&logits, 1);
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        assert!((lp - (3.0f32.exp() / z).ln()).abs() < 1e-6);
    }
}
