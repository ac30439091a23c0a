//! Generalised advantage estimation over one completion, and the whitening of a batch's
//! advantages.
//!
//! A completion is an episode whose only reward comes with its last token: token rewards
//! `r_t` are 0 except `r_{T−1} = R` (the task's reward, less the KL with `kl_in = "reward"`),
//! and the value after the last token is 0. With the critic's values `V_t` (the value of the
//! state that emits token `t`):
//!
//! ```text
//! δ_t = r_t + γ·V_{t+1} − V_t          (V_T = 0)
//! A_t = δ_t + γλ·A_{t+1}                (A_T = 0)
//! G_t = A_t + V_t                       (the critic's target, the λ-return)
//! ```

/// The advantages and returns of one completion from its values (one per token) and its
/// reward; both as long as `values`.
pub fn gae(values: &[f32], reward: f32, gamma: f32, lambda: f32) -> (Vec<f32>, Vec<f32>) {
    let n = values.len();
    let mut adv = vec![0.0f32; n];
    let mut next_value = 0.0f32;
    let mut next_adv = 0.0f32;
    for t in (0..n).rev() {
        let r = if t + 1 == n { reward } else { 0.0 };
        let delta = r + gamma * next_value - values[t];
        next_adv = delta + gamma * lambda * next_adv;
        adv[t] = next_adv;
        next_value = values[t];
    }
    let returns = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, returns)
}

/// Whitens every advantage of `rows` together: minus their mean, divided by their standard
/// deviation (plus 1e-8); rows of one token each carry over as they are if all are equal.
pub fn whiten(rows: &mut [Vec<f32>]) {
    let n: usize = rows.iter().map(Vec::len).sum();
    if n == 0 {
        return;
    }
    let mean = rows.iter().flatten().map(|&a| f64::from(a)).sum::<f64>() / n as f64;
    let var = rows
        .iter()
        .flatten()
        .map(|&a| (f64::from(a) - mean).powi(2))
        .sum::<f64>()
        / n as f64;
    let scale = 1.0 / (var.sqrt() + 1e-8);
    for a in rows.iter_mut().flatten() {
        *a = ((f64::from(*a) - mean) * scale) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    /// By hand, γ = 0.9, λ = 0.5, V = [0.2, 0.4, 0.1], R = 1:
    /// δ_2 = 1 − 0.1 = 0.9; δ_1 = 0.9·0.1 − 0.4 = −0.31; δ_0 = 0.9·0.4 − 0.2 = 0.16;
    /// A_2 = 0.9; A_1 = −0.31 + 0.45·0.9 = 0.095; A_0 = 0.16 + 0.45·0.095 = 0.20275;
    /// G = A + V = [0.40275, 0.495, 1.0].
    #[test]
    fn gae_matches_a_hand_computed_completion() {
        let (adv, ret) = gae(&[0.2, 0.4, 0.1], 1.0, 0.9, 0.5);
        close(&adv, &[0.20275, 0.095, 0.9]);
        close(&ret, &[0.40275, 0.495, 1.0]);
    }

    /// λ = 1, γ = 1: every advantage is the reward less the token's value (Monte Carlo), and
    /// every return is the reward; λ = 0: one-step TD.
    #[test]
    fn gae_at_its_limits() {
        let v = [0.3, -0.2, 0.5];
        let (adv, ret) = gae(&v, 2.0, 1.0, 1.0);
        close(&adv, &[1.7, 2.2, 1.5]);
        close(&ret, &[2.0, 2.0, 2.0]);
        let (adv, _) = gae(&v, 2.0, 1.0, 0.0);
        close(&adv, &[-0.2 - 0.3, 0.5 + 0.2, 2.0 - 0.5]);
        assert_eq!(gae(&[], 1.0, 1.0, 1.0), (vec![], vec![]));
    }

    #[test]
    fn whitening_is_over_every_token_of_the_batch() {
        let mut rows = vec![vec![1.0, 3.0], vec![5.0], vec![]];
        whiten(&mut rows);
        // mean 3, std sqrt(8/3)
        let s = (8.0f32 / 3.0).sqrt();
        close(&rows[0], &[-2.0 / s, 0.0]);
        close(&rows[1], &[2.0 / s]);
        assert!(rows[2].is_empty());
        let mut same = vec![vec![0.5, 0.5]];
        whiten(&mut same);
        close(&same[0], &[0.0, 0.0]);
    }
}
