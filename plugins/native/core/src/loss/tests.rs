//! Unit tests of the losses: each variant against a hand-computed batch, a finite-difference
//! check of its gradient, and the defaults equal to the loss before the variants.

use super::*;

#[test]
fn grpo_advantages_are_group_normalised() {
    let a = grpo_advantages(&[1.0, 0.0, 0.0, 1.0, 5.0, 5.0], 2, true).unwrap();
    assert!(
        (a[0] - 1.0).abs() < 1e-4 && (a[1] + 1.0).abs() < 1e-4,
        "{a:?}"
    );
    assert!((a[2] + 1.0).abs() < 1e-4 && (a[3] - 1.0).abs() < 1e-4);
    assert_eq!(&a[4..], &[0.0, 0.0], "equal rewards carry no signal");
    let b = grpo_advantages(&[3.0, 1.0], 2, false).unwrap();
    assert_eq!(b, vec![1.0, -1.0]);
    assert!(grpo_advantages(&[1.0, 2.0, 3.0], 2, true).is_err());
}

#[test]
fn policy_loss_value_matches_the_documented_formula() {
    // One sequence of 2 tokens, vocab 3: only token 1 counts.
    let mut logits = vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let tokens = [0u32, 2];
    let mask = [0.0, 1.0];
    let lp = (1.0f32 / 3.0).ln();
    let (adv, old, rf) = ([0.0, 2.0], [0.0, lp - 0.5], [0.0, lp + 0.3]);
    let cfg = PolicyLossConfig {
        kl_coef: 0.1,
        ..PolicyLossConfig::default()
    };
    let loss = Loss::Policy {
        cfg,
        advantages: &adv,
        old_logprobs: &old,
        ref_logprobs: Some(&rf),
    };
    let mut out = [0.0; 2];
    let st = apply_loss(&mut logits, 3, &tokens, 2, &mask, &loss, None, &mut out).unwrap();
    // r = e^0.5 > 1.2 with A > 0: clipped term 1.2·A is the min; k3 with Δ = 0.3.
    let want = -(1.2 * 2.0) + 0.1 * (0.3f64.exp() - 0.3 - 1.0);
    assert!((st.loss - want).abs() < 1e-5, "{} vs {want}", st.loss);
    assert_eq!(st.clip_frac, 1.0);
    assert!((out[1] - lp).abs() < 1e-6);
}

// ---- the variants on one hand-computed batch ---------------------------------------------
//
// Two sequences of T = 3 tokens over a vocabulary of 3, all logits 0: every new logprob is
// lp = ln(1/3). Counted tokens (mask 1): sequence 0 positions 1 and 2, sequence 1 position 2
// (its position 1 is prompt). Per counted token, δ = lp − old, A, d = ref − lp:
//
//   token   δ      r = e^δ      A    d      k3 = e^d − d − 1   k1 = −d
//   s0 t1   0.10   1.1051709    1    0.2    0.0214028          −0.2
//   s0 t2   0.22   1.2460767    1   −0.1    0.0048374           0.1
//   s1 t2  −0.40   0.6703200   −2    0.3    0.0498588          −0.3
//
// Clip ε_low = 0.2, ε_high = 0.28 (range [0.8, 1.28]), β = 0.1:
//   pg(s0 t1) = −1.1051709 (inside);  pg(s0 t2) = −1.2460767 (inside 1.28; a symmetric 0.2
//   would clip it to −1.2);  pg(s1 t2) = −min(−1.3406401, 0.8·−2 = −1.6) = 1.6 (clipped).
//   ℓ = pg + 0.1·k3 = −1.1030306, −1.2455930, 1.6049859 (Σ = −0.7436377).

const LP: f32 = -1.098_612_3; // ln(1/3)

/// Six token-aligned entries (two sequences of three).
type Row = [f32; 6];

/// `(tokens, mask, advantages, old, ref)` of the batch above.
fn hand_batch() -> ([u32; 6], Row, Row, Row, Row) {
    let lp = (1.0f32 / 3.0).ln();
    (
        [0, 1, 2, 0, 2, 1],
        [0.0, 1.0, 1.0, 0.0, 0.0, 1.0],
        [1.0, 1.0, 1.0, -2.0, -2.0, -2.0],
        [lp, lp - 0.1, lp - 0.22, lp, lp, lp + 0.4],
        [lp, lp + 0.2, lp - 0.1, lp, lp, lp + 0.3],
    )
}

fn hand_cfg() -> PolicyLossConfig {
    PolicyLossConfig {
        clip_low: 0.2,
        clip_high: 0.28,
        kl_coef: 0.1,
        ..PolicyLossConfig::default()
    }
}

/// The loss statistics and `∂L/∂logits` of the hand batch under `cfg`.
fn hand_eval(cfg: PolicyLossConfig, normalizer: Option<f32>) -> (LossStats, Vec<f32>) {
    let (tokens, mask, adv, old, rf) = hand_batch();
    let mut logits = vec![0.0f32; 6 * 3];
    let mut lp = [0.0f32; 6];
    let loss = Loss::Policy {
        cfg,
        advantages: &adv,
        old_logprobs: &old,
        ref_logprobs: Some(&rf),
    };
    let st = apply_loss(
        &mut logits,
        3,
        &tokens,
        3,
        &mask,
        &loss,
        normalizer,
        &mut lp,
    )
    .unwrap();
    assert!(
        (lp[1] - LP).abs() < 1e-6 && (lp[5] - LP).abs() < 1e-6,
        "{lp:?}"
    );
    (st, logits)
}

fn close(what: &str, got: f64, want: f64) {
    assert!((got - want).abs() < 2e-6, "{what}: {got} vs {want}");
}

/// `∂L/∂logit` of the target token of each row: `coef · (1 − 1/3)` with `coef = ∂L/∂lp`.
fn target_grads(dlogits: &[f32]) -> [f64; 6] {
    let tokens = hand_batch().0;
    std::array::from_fn(|row| {
        let i = row + 1;
        if i >= 6 || i % 3 == 0 {
            0.0
        } else {
            f64::from(dlogits[row * 3 + tokens[i] as usize])
        }
    })
}

#[test]
fn token_mean_k3_with_asymmetric_clip_matches_the_hand_computed_batch() {
    let (st, g) = hand_eval(hand_cfg(), None);
    // Σ ℓ / 3 = −0.7436377 / 3.
    close("loss", st.loss, -0.247_879_25);
    close("kl", st.kl, 0.025_366_33); // (0.0214028 + 0.0048374 + 0.0498588) / 3
    close("clip_frac", st.clip_frac, 1.0 / 3.0); // s1 t2 only
    // ∂L/∂lp = (1/3)·(−A·r + β·(1 − e^d)): s0 t1 (1/3)(−1.1051709 − 0.0221403) = −0.3757704;
    // s0 t2 (1/3)(−1.2460767 + 0.0095163) = −0.4121868; s1 t2 (clipped) (1/3)(−0.0349859)
    // = −0.0116620. The target logit's gradient is 2/3 of it.
    let tg = target_grads(&g);
    close("grad s0 t1", tg[0], -0.375_770_4 * 2.0 / 3.0);
    close("grad s0 t2", tg[1], -0.412_186_8 * 2.0 / 3.0);
    close("grad s1 t2", tg[4], -0.011_662_0 * 2.0 / 3.0);
    // Symmetric 0.2 (no clip-higher) clips s0 t2 too: ℓ = −1.2 + 0.0004837, so
    // L = (−1.1030306 − 1.1995163 + 1.6049859) / 3 = −0.2325203 and 2 tokens of 3 clip.
    let sym = PolicyLossConfig {
        clip_high: 0.2,
        ..hand_cfg()
    };
    let (st, g) = hand_eval(sym, None);
    close("symmetric loss", st.loss, -0.232_520_34);
    close("symmetric clip_frac", st.clip_frac, 2.0 / 3.0);
    close(
        "symmetric grad s0 t2",
        target_grads(&g)[1],
        0.009_516_3 / 3.0 * 2.0 / 3.0,
    );
}

#[test]
fn sequence_mean_matches_the_hand_computed_batch() {
    let cfg = PolicyLossConfig {
        aggregation: Aggregation::SequenceMean,
        ..hand_cfg()
    };
    let (st, g) = hand_eval(cfg, None);
    // ((−1.1030306 − 1.2455930) / 2 + 1.6049859) / 2.
    close("loss", st.loss, 0.215_337_03);
    // w = 1/(n_b·B): 1/4 for sequence 0's tokens, 1/2 for sequence 1's.
    let tg = target_grads(&g);
    close(
        "grad s0 t1",
        tg[0],
        (-1.105_170_9 - 0.022_140_3) / 4.0 * 2.0 / 3.0,
    );
    close("grad s1 t2", tg[4], -0.034_985_9 / 2.0 * 2.0 / 3.0);
}

#[test]
fn constant_length_matches_the_hand_computed_batch_and_takes_the_global_normaliser() {
    let cfg = PolicyLossConfig {
        aggregation: Aggregation::ConstantLength(4.0),
        ..hand_cfg()
    };
    // Σ ℓ / (B·C) = −0.7436377 / (2·4).
    let (st, g) = hand_eval(cfg, None);
    close("loss", st.loss, -0.092_954_72);
    close(
        "grad s0 t1",
        target_grads(&g)[0],
        -1.127_311_2 / 8.0 * 2.0 / 3.0,
    );
    // As part of a batch of 4 sequences: −0.7436377 / 16.
    let (st, _) = hand_eval(cfg, Some(16.0));
    close("loss of a part", st.loss, -0.046_477_36);
    // No length: refused.
    let (tokens, mask, adv, old, _) = hand_batch();
    let bad = Loss::Policy {
        cfg: PolicyLossConfig {
            aggregation: Aggregation::ConstantLength(0.0),
            kl_coef: 0.0,
            ..hand_cfg()
        },
        advantages: &adv,
        old_logprobs: &old,
        ref_logprobs: None,
    };
    let err = apply_loss(
        &mut [0.0; 18],
        3,
        &tokens,
        3,
        &mask,
        &bad,
        None,
        &mut [0.0; 6],
    );
    assert!(err.is_err(), "{err:?}");
}

#[test]
fn k1_matches_the_hand_computed_batch() {
    let cfg = PolicyLossConfig {
        kl: KlEstimator::K1,
        ..hand_cfg()
    };
    let (st, g) = hand_eval(cfg, None);
    // ℓ = pg + 0.1·(−d) = −1.1251709, −1.2360767, 1.57; Σ / 3.
    close("loss", st.loss, -0.263_749_22);
    close("kl", st.kl, -0.133_333_33); // (−0.2 + 0.1 − 0.3) / 3
    // ∂k1/∂lp = 1: s0 t1 (1/3)(−1.1051709 + 0.1); s1 t2 (clipped) (1/3)(0.1).
    let tg = target_grads(&g);
    close("grad s0 t1", tg[0], -1.005_170_9 / 3.0 * 2.0 / 3.0);
    close("grad s1 t2", tg[4], 0.1 / 3.0 * 2.0 / 3.0);
}

#[test]
fn sequence_ratio_matches_the_hand_computed_batch() {
    // GSPO: s0 = exp((0.1 + 0.22)/2) = e^0.16 = 1.1735109 (inside [0.8, 1.28]) → pg = −1.1735109
    // on both tokens of sequence 0; s1 = e^−0.4 = 0.6703200 → clipped, pg = 1.6 as before.
    // ℓ = −1.1735109 + 0.0021403, −1.1735109 + 0.0004837, 1.6049859.
    let cfg = PolicyLossConfig {
        ratio: RatioLevel::Sequence,
        aggregation: Aggregation::SequenceMean,
        ..hand_cfg()
    };
    let (st, g) = hand_eval(cfg, None);
    // ((−1.1713706 − 1.1730272) / 2 + 1.6049859) / 2.
    close("loss", st.loss, 0.216_393_51);
    close("clip_frac", st.clip_frac, 1.0 / 3.0);
    // ∂L/∂lp_i = w_i·(−A_b·s_b + β·(1 − e^d)), w = 1/4 in sequence 0:
    // t1 (−1.1735109 − 0.0221403)/4 = −0.2989128; t2 (−1.1735109 + 0.0095163)/4 = −0.2909987;
    // s1 t2 (clipped): (−0.0349859)/2 = −0.0174929.
    let tg = target_grads(&g);
    close("grad s0 t1", tg[0], -0.298_912_8 * 2.0 / 3.0);
    close("grad s0 t2", tg[1], -0.290_998_7 * 2.0 / 3.0);
    close("grad s1 t2", tg[4], -0.017_492_9 * 2.0 / 3.0);
    // With token-mean each sequence's pg weighs by its length: Σ ℓ / 3.
    let tm = PolicyLossConfig {
        aggregation: Aggregation::TokenMean,
        ..cfg
    };
    close("token-mean loss", hand_eval(tm, None).0.loss, -0.246_470_61);
}

#[test]
fn the_batch_s_own_normaliser_given_explicitly_is_the_same_loss_bit_for_bit() {
    // A trainer that splits a batch passes the global normaliser; for the whole batch it is
    // Σ mask = 3 (token-mean), B = 2 (sequence-mean), B·C = 8 (constant-length 4).
    for (aggregation, z) in [
        (Aggregation::TokenMean, 3.0),
        (Aggregation::SequenceMean, 2.0),
        (Aggregation::ConstantLength(4.0), 8.0),
    ] {
        let cfg = PolicyLossConfig {
            aggregation,
            ..hand_cfg()
        };
        let (st, g) = hand_eval(cfg, None);
        let (st2, g2) = hand_eval(cfg, Some(z));
        assert_eq!(st, st2, "{aggregation:?}");
        assert_eq!(g, g2, "{aggregation:?}");
    }
}

// ---- finite-difference gradient checks, one per variant ----------------------------------

/// Deterministic values in [−1, 1).
fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Central differences of `L` against the analytic `∂L/∂logits` of every logit, for
/// `cfg` on a batch of 3 sequences × 6 tokens, vocab 5, with behaviour logprobs that put
/// every ratio (token or sequence) well inside or well outside the clip range, so no step of
/// the difference crosses a kink.
fn gradcheck(cfg: PolicyLossConfig) {
    const B: usize = 3;
    const T: usize = 6;
    const V: usize = 5;
    let n = B * T;
    let logits0: Vec<f32> = noise(n * V, 1).iter().map(|x| 2.0 * x).collect();
    let tokens: Vec<u32> = noise(n, 2)
        .iter()
        .map(|x| ((x + 1.0) * 2.5) as u32 % V as u32)
        .collect();
    // Prompt lengths 2, 3, 1: the rest counts.
    let prompt = [2, 3, 1];
    let mask: Vec<f32> = (0..n)
        .map(|i| f32::from(u8::from(i % T >= prompt[i / T])))
        .collect();
    let adv: Vec<f32> = (0..n).map(|i| [1.5, -0.7, 0.9][i / T]).collect();
    let mut lp = vec![0.0f32; n];
    apply_loss(
        &mut logits0.clone(),
        V,
        &tokens,
        T,
        &mask,
        &Loss::Sft,
        None,
        &mut lp,
    )
    .unwrap();
    // Per sequence δ = lp − old ≈ 0.6 / 0.02 / −0.6 (± 0.01 per token): sequence 0 clips
    // high (A > 0), sequence 1 stays inside, sequence 2 is inside on the low side for A > 0.
    let jitter = noise(n, 3);
    let old: Vec<f32> = (0..n)
        .map(|i| lp[i] - [0.6, 0.02, -0.6][i / T] - 0.01 * jitter[i])
        .collect();
    let rf: Vec<f32> = noise(n, 4)
        .iter()
        .zip(&lp)
        .map(|(x, l)| l + 0.4 * x)
        .collect();
    let loss = Loss::Policy {
        cfg,
        advantages: &adv,
        old_logprobs: &old,
        ref_logprobs: Some(&rf),
    };
    let eval = |logits: &[f32]| {
        let mut l = logits.to_vec();
        let mut out = vec![0.0; n];
        let st = apply_loss(&mut l, V, &tokens, T, &mask, &loss, None, &mut out).unwrap();
        (st, l)
    };
    let (st, grad) = eval(&logits0);
    assert!(st.clip_frac > 0.0 && st.clip_frac < 1.0, "{cfg:?}: {st:?}");
    let scale = grad.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 1e-2, "{cfg:?}: gradients ~0");
    let h = 1e-2f32;
    for k in 0..n * V {
        let mut up = logits0.clone();
        up[k] += h;
        let mut down = logits0.clone();
        down[k] -= h;
        let fd = (eval(&up).0.loss - eval(&down).0.loss) / (2.0 * f64::from(h));
        let err = (f64::from(grad[k]) - fd).abs();
        assert!(
            err <= 1e-3 * f64::from(scale) + 1e-2 * fd.abs(),
            "{cfg:?}: logit {k}: analytic {} vs finite difference {fd}",
            grad[k]
        );
    }
}

fn fd_cfg() -> PolicyLossConfig {
    PolicyLossConfig {
        clip_low: 0.2,
        clip_high: 0.28,
        kl_coef: 0.3,
        ..PolicyLossConfig::default()
    }
}

#[test]
fn gradient_of_token_mean_k3_matches_finite_differences() {
    gradcheck(fd_cfg());
}

#[test]
fn gradient_of_sequence_mean_matches_finite_differences() {
    gradcheck(PolicyLossConfig {
        aggregation: Aggregation::SequenceMean,
        ..fd_cfg()
    });
}

#[test]
fn gradient_of_constant_length_matches_finite_differences() {
    gradcheck(PolicyLossConfig {
        aggregation: Aggregation::ConstantLength(7.0),
        ..fd_cfg()
    });
}

#[test]
fn gradient_of_k1_matches_finite_differences() {
    gradcheck(PolicyLossConfig {
        kl: KlEstimator::K1,
        ..fd_cfg()
    });
}

#[test]
fn gradient_of_the_sequence_ratio_matches_finite_differences() {
    for aggregation in [Aggregation::SequenceMean, Aggregation::TokenMean] {
        gradcheck(PolicyLossConfig {
            ratio: RatioLevel::Sequence,
            aggregation,
            ..fd_cfg()
        });
    }
}
