//! The sampling side of speculative decoding: the target distribution `p` that
//! [`crate::sampling::sample`] draws from, materialised over the vocabulary, and the
//! standard speculative (rejection) sampling rule that keeps the output distribution exactly
//! the target's.
//!
//! Rule, per draft token `d` drawn from the drafter's `q`: accept with probability
//! `min(1, p(d) / q(d))`; on rejection emit a token drawn from `norm(max(0, p − q))` and end
//! the round. For any `q`, the emitted token is then distributed as `p`:
//! `P(x) = q(x)·min(1, p(x)/q(x)) + (1 − Σ_y min(p(y), q(y))) · max(0, p(x) − q(x)) / Σ_y
//! max(0, p(y) − q(y)) = min(p, q)(x) + max(0, p − q)(x) = p(x)`.

use crate::sampling::{Rng, SamplingParams, argmax};

/// Writes into `p` (`[vocab]`) the distribution [`crate::sampling::sample`] draws from for
/// `logits` under `params`: the same weights `exp((x − max) / T)`, the same top-k and top-p
/// truncation (same order, same f32 sums), normalised by the same kept total; zero outside
/// the kept set. Greedy (`T ≤ 0`) is the one-hot argmax.
pub(super) fn target_dist(
    logits: &[f32],
    params: &SamplingParams,
    scratch: &mut Vec<(f32, u32)>,
    p: &mut [f32],
) {
    p.fill(0.0);
    if params.temperature <= 0.0 {
        p[argmax(logits)] = 1.0;
        return;
    }
    let inv_t = 1.0 / params.temperature;
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    scratch.clear();
    scratch.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (((x - m) * inv_t).exp(), i as u32)),
    );
    let truncate = (params.top_k > 0 && params.top_k < logits.len()) || params.top_p < 1.0;
    if truncate {
        scratch.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        if params.top_k > 0 && params.top_k < scratch.len() {
            scratch.truncate(params.top_k);
        }
        if params.top_p < 1.0 {
            let total: f32 = scratch.iter().map(|x| x.0).sum();
            let mut acc = 0.0;
            let mut keep = scratch.len();
            for (i, x) in scratch.iter().enumerate() {
                acc += x.0 / total;
                if acc >= params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            scratch.truncate(keep);
        }
    }
    let total: f32 = scratch.iter().map(|x| x.0).sum();
    for &(w, i) in scratch.iter() {
        p[i as usize] = w / total;
    }
}

/// Draws an index from the non-negative weights `w` (which need not sum to 1) with one
/// uniform draw; `None` when they sum to zero.
fn draw(w: impl Iterator<Item = f64> + Clone, rng: &mut Rng) -> Option<usize> {
    let total: f64 = w.clone().sum();
    if total <= 0.0 {
        return None;
    }
    let mut u = f64::from(rng.next_f32()) * total;
    let mut last = None;
    for (i, x) in w.enumerate() {
        if x > 0.0 {
            if u < x {
                return Some(i);
            }
            u -= x;
            last = Some(i);
        }
    }
    last
}

/// One acceptance test of speculative sampling for draft token `d` drawn from `q`, with the
/// target distribution `p` (both `[vocab]`). Returns `(token, accepted)`: `(d, true)` with
/// probability `min(1, p(d)/q(d))`, otherwise a token drawn from `norm(max(0, p − q))`
/// (from `p` if that residual is numerically empty).
pub(super) fn accept_or_resample(p: &[f32], q: &[f32], d: usize, rng: &mut Rng) -> (usize, bool) {
    let u = rng.next_f32();
    // u < p/q without dividing (q(d) = 0 would only come from a drafter breaking the
    // contract; it accepts whenever p(d) > 0).
    if u * q[d] < p[d] {
        return (d, true);
    }
    let residual = p.iter().zip(q).map(|(&a, &b)| f64::from((a - b).max(0.0)));
    let tok = draw(residual, rng)
        .or_else(|| draw(p.iter().map(|&a| f64::from(a)), rng))
        .unwrap_or(d);
    (tok, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::sample;

    #[test]
    fn target_dist_matches_what_sample_draws() {
        let logits = [0.3, 2.0, -1.0, 1.5, 1.9, 0.0];
        let cases = [
            SamplingParams::default(),
            SamplingParams {
                temperature: 0.7,
                top_k: 3,
                ..Default::default()
            },
            SamplingParams {
                temperature: 1.3,
                top_p: 0.8,
                ..Default::default()
            },
        ];
        let (mut s, mut p) = (Vec::new(), vec![0.0; 6]);
        for params in &cases {
            target_dist(&logits, params, &mut s, &mut p);
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            let n = 200_000;
            let mut seen = [0usize; 6];
            let mut rng = Rng::new(5);
            for _ in 0..n {
                seen[sample(&logits, params, &mut rng, &mut s)] += 1;
            }
            for (i, &c) in seen.iter().enumerate() {
                let f = c as f32 / n as f32;
                assert!(
                    (f - p[i]).abs() < 0.005,
                    "{params:?} token {i}: {f} vs {}",
                    p[i]
                );
                if p[i] == 0.0 {
                    assert_eq!(c, 0);
                }
            }
        }
        let greedy = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        target_dist(&logits, &greedy, &mut s, &mut p);
        assert_eq!(p, [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn rejection_sampling_reproduces_p() {
        let p = [0.5, 0.3, 0.2, 0.0];
        let q = [0.1, 0.2, 0.3, 0.4];
        let n = 200_000;
        let mut seen = [0usize; 4];
        let mut rng = Rng::new(9);
        for _ in 0..n {
            // d ~ q
            let d = draw(q.iter().map(|&x| f64::from(x)), &mut rng).unwrap();
            seen[accept_or_resample(&p, &q, d, &mut rng).0] += 1;
        }
        for i in 0..4 {
            let f = seen[i] as f32 / n as f32;
            assert!((f - p[i]).abs() < 0.005, "token {i}: {f} vs {}", p[i]);
        }
        assert_eq!(seen[3], 0);
    }
}
