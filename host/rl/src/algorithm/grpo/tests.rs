//! GRPO's advantages, variants, KL in the reward and sampling rounds, on hand-computed batches.
use super::*;

fn s(group: usize, reward: f32) -> Sample {
    Sample {
        group,
        prompt: vec![1, 5],
        completion: vec![7, 2],
        logprobs: vec![-0.5, -0.1],
        reward,
        version: 0,
        turn: None,
    }
}

#[test]
fn advantages_are_group_relative() {
    let samples = [s(0, 1.0), s(0, 0.0), s(1, 0.5), s(1, 0.5)];
    let a = advantages(&samples);
    assert!(
        (a[0] - 1.0).abs() < 1e-3 && (a[1] + 1.0).abs() < 1e-3,
        "{a:?}"
    );
    assert_eq!(&a[2..], &[0.0, 0.0]);
    let b = batch(&samples, &a, loss(1e-3, 0.2, 0.0, 1.0), false);
    assert_eq!(b.sequences.len(), 2);
    assert_eq!(b.sequences[0].tokens.as_slice(), &[1, 5, 7, 2]);
    assert_eq!(b.sequences[0].prompt_len, 2);
    let all = batch(&samples, &a, loss(1e-3, 0.2, 0.1, 1.0), true);
    assert_eq!(all.sequences.len(), 4);
}

#[test]
fn the_policy_loss_is_the_default_unless_a_variant_is_named() {
    let mut a = AlgorithmSection::default();
    assert!(policy_loss(&a).is_default());
    a.kl_estimator = KlEstimator::K1;
    a.kl_in = KlIn::Reward;
    // The k1 estimate went into the rewards: the loss has no KL to estimate.
    assert!(policy_loss(&a).is_default());
    a.kl_in = KlIn::Loss;
    assert_eq!(
        policy_loss(&a).kl_estimator,
        tandem_plugin_api::KlEstimator::K1
    );
    a.loss_agg = LossAgg::DrGrpo;
    a.ratio = Ratio::Sequence;
    a.max_tokens = 6;
    let p = policy_loss(&a);
    assert_eq!(
        (p.aggregation, p.constant_length, p.ratio),
        (LossAggregation::ConstantLength, 6, RatioLevel::Sequence)
    );
    assert!(!p.is_default());
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
    }
}

/// Group 0 has rewards 1, 0, 0, 0 (mean 0.25, std √0.1875 = 0.43301), group 1 has 0.5
/// twice (no signal); all six rewards have std √(0.25 − 1/9) = 0.37268.
#[test]
fn advantages_scale_by_group_batch_or_nothing() {
    let samples = [
        s(0, 1.0),
        s(0, 0.0),
        s(0, 0.0),
        s(0, 0.0),
        s(1, 0.5),
        s(1, 0.5),
    ];
    let rewards: Vec<f32> = samples.iter().map(|s| s.reward).collect();
    let group = scaled_advantages(&samples, &rewards, ScaleRewards::Group);
    let (hi, lo) = (0.75 / (0.433_012_7 + 1e-4), -0.25 / (0.433_012_7 + 1e-4));
    close(&group, &[hi, lo, lo, lo, 0.0, 0.0]);
    // Bit for bit what the loop has always computed.
    assert_eq!(group, advantages(&samples));
    let batch = scaled_advantages(&samples, &rewards, ScaleRewards::Batch);
    let (hi, lo) = (0.75 / (0.372_678 + 1e-4), -0.25 / (0.372_678 + 1e-4));
    close(&batch, &[hi, lo, lo, lo, 0.0, 0.0]);
    let none = scaled_advantages(&samples, &rewards, ScaleRewards::None);
    close(&none, &[0.75, -0.25, -0.25, -0.25, 0.0, 0.0]);
}

/// Logprobs −0.5, −0.1 against reference −0.7, −0.1: d = −0.2, 0, so k1 = 0.2 and
/// k3 = e^−0.2 + 0.2 − 1 = 0.0187308.
#[test]
fn kl_in_the_reward_subtracts_the_summed_estimate() {
    let refs = [-0.7, -0.1];
    let k1 = sequence_kl(&[-0.5, -0.1], &refs, KlEstimator::K1);
    let k3 = sequence_kl(&[-0.5, -0.1], &refs, KlEstimator::K3);
    close(&[k1, k3], &[0.2, 0.018_730_75]);
    let samples = [s(0, 1.0), s(0, 0.0)];
    let rows = vec![refs.to_vec(), Vec::new()];
    let shaped = kl_penalised(&samples, &rows, 0.5, KlEstimator::K1);
    close(&shaped, &[0.9, 0.0]);
    let shaped = kl_penalised(&samples, &rows, 0.5, KlEstimator::K3);
    close(&shaped, &[1.0 - 0.5 * 0.018_730_75, 0.0]);
}

fn round(rewards: &[&[f32]]) -> Rollout {
    let samples: Vec<Sample> = rewards
        .iter()
        .enumerate()
        .flat_map(|(g, rs)| rs.iter().map(move |&r| s(g, r)))
        .collect();
    let exact = samples.iter().filter(|s| s.reward >= 1.0).count();
    Rollout {
        samples,
        exact,
        tally: Default::default(),
        failures: Vec::new(),
        items: Vec::new(),
        calls: None,
        ledger: Default::default(),
    }
}

#[test]
fn dynamic_sampling_replaces_groups_without_signal_within_its_rounds() {
    let mut d = Sampling::new(2, 3);
    assert!(d.dynamic());
    d.add(round(&[&[1.0, 1.0], &[1.0, 0.0]]));
    assert_eq!((d.kept(), d.dropped, d.next_round()), (1, 1, Some(1)));
    d.add(round(&[&[0.0, 0.0]]));
    assert_eq!((d.kept(), d.dropped, d.next_round()), (1, 2, Some(1)));
    d.add(round(&[&[0.0, 1.0]]));
    assert_eq!(
        (d.rounds, d.kept(), d.dropped, d.next_round()),
        (3, 2, 2, None)
    );
    let (all, train) = d.finish();
    assert_eq!((all.samples.len(), all.exact), (8, 4));
    let groups: Vec<usize> = train.iter().map(|s| s.group).collect();
    assert_eq!(groups, [1, 1, 3, 3]);
    // The bound: two rounds, one group with signal.
    let mut d = Sampling::new(2, 2);
    d.add(round(&[&[1.0, 1.0], &[1.0, 0.0]]));
    d.add(round(&[&[0.0, 0.0]]));
    assert_eq!((d.rounds, d.kept(), d.next_round()), (2, 1, None));
    assert_eq!(d.finish().1.len(), 2);
    // Without dynamic sampling: one round, kept whole.
    let mut d = Sampling::new(2, 0);
    d.add(round(&[&[1.0, 1.0], &[1.0, 0.0]]));
    assert_eq!(d.next_round(), None);
    assert_eq!(d.finish().1.len(), 4);
}
