//! Per-token advantages (PPO with a critic) through the policy loss: a token-aligned array
//! holding each sequence's advantage on its completion tokens is the per-sequence path bit
//! for bit, in every variant; under the sequence ratio a sequence's advantage is the masked
//! mean of its tokens'.

use super::*;

const B: usize = 3;
const T: usize = 5;
const V: usize = 7;
const SEQ_ADV: [f32; B] = [1.5, -0.7, 0.3];

fn noise(n: usize, salt: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2_654_435_761) ^ salt.wrapping_mul(40_503)) % 1000) as f32
                / 500.0
                - 1.0
        })
        .collect()
}

fn mask() -> Vec<f32> {
    // Prompts of 1, 2 and 3 tokens; the last sequence is padded after 4 tokens.
    let spans = [(1, 5), (2, 5), (3, 4)];
    (0..B * T)
        .map(|i| {
            let (p, n) = spans[i / T];
            f32::from((p..n).contains(&(i % T)))
        })
        .collect()
}

fn eval(cfg: PolicyLossConfig, adv: &[f32]) -> (LossStats, Vec<f32>, Vec<f32>) {
    let tokens: Vec<u32> = noise(B * T, 3)
        .iter()
        .map(|x| ((x + 1.0) * 3.4) as u32)
        .collect();
    let mut logits = noise(B * T * V, 5);
    let lp_now: Vec<f32> = noise(B * T, 7).iter().map(|x| x * 0.2 - 2.0).collect();
    let old: Vec<f32> = lp_now
        .iter()
        .zip(noise(B * T, 9))
        .map(|(a, b)| a + 0.3 * b)
        .collect();
    let rf: Vec<f32> = lp_now
        .iter()
        .zip(noise(B * T, 11))
        .map(|(a, b)| a + 0.5 * b)
        .collect();
    let loss = Loss::Policy {
        cfg,
        advantages: adv,
        old_logprobs: &old,
        ref_logprobs: Some(&rf),
    };
    let mut lp = vec![0f32; B * T];
    let st = apply_loss(&mut logits, V, &tokens, T, &mask(), &loss, None, &mut lp).unwrap();
    (st, logits, lp)
}

fn variants() -> Vec<PolicyLossConfig> {
    let base = PolicyLossConfig {
        clip_low: 0.2,
        clip_high: 0.28,
        kl_coef: 0.1,
        ..PolicyLossConfig::default()
    };
    vec![
        base,
        PolicyLossConfig {
            aggregation: Aggregation::SequenceMean,
            ..base
        },
        PolicyLossConfig {
            aggregation: Aggregation::ConstantLength(8.0),
            ..base
        },
        PolicyLossConfig {
            aggregation: Aggregation::SequenceMean,
            ratio: RatioLevel::Sequence,
            ..base
        },
        PolicyLossConfig {
            kl: KlEstimator::K1,
            ..base
        },
    ]
}

#[test]
fn per_token_advantages_equal_to_the_sequence_s_are_the_per_sequence_path_bit_for_bit() {
    // The per-sequence path: the advantage on every position of its row.
    let per_seq: Vec<f32> = (0..B * T).map(|i| SEQ_ADV[i / T]).collect();
    // Per token: the sequence's advantage on its completion tokens, 0 elsewhere.
    let m = mask();
    let per_token: Vec<f32> = (0..B * T).map(|i| m[i] * SEQ_ADV[i / T]).collect();
    for cfg in variants() {
        let a = eval(cfg, &per_seq);
        let b = eval(cfg, &per_token);
        assert_eq!(a.0, b.0, "{cfg:?}");
        assert!(
            a.0.clip_frac > 0.0 || cfg.ratio == RatioLevel::Sequence,
            "{cfg:?}"
        );
        assert_eq!(
            a.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{cfg:?}"
        );
        assert_eq!(a.2, b.2, "{cfg:?}");
    }
}

#[test]
fn per_token_advantages_count_per_token_and_average_under_the_sequence_ratio() {
    let m = mask();
    let varying: Vec<f32> = noise(B * T, 13)
        .iter()
        .zip(&m)
        .map(|(x, m)| x * m)
        .collect();
    let per_seq = |adv: &[f32]| -> Vec<f32> {
        (0..B * T)
            .map(|i| {
                let row = (i / T) * T..(i / T + 1) * T;
                let n: f32 = m[row.clone()].iter().sum();
                row.map(|j| m[j] * adv[j]).sum::<f32>() / n
            })
            .collect()
    };
    let means = per_seq(&varying);
    for cfg in variants() {
        let a = eval(cfg, &varying);
        let b = eval(cfg, &means);
        if cfg.ratio == RatioLevel::Sequence {
            assert!(
                (a.0.loss - b.0.loss).abs() < 1e-6,
                "{cfg:?}: {a:?} vs {b:?}"
            );
        } else {
            assert_ne!(
                a.0.loss, b.0.loss,
                "{cfg:?}: per-token advantages were averaged"
            );
        }
    }
}
