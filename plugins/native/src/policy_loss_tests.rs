//! `train_step_policy` of the native trainer through the root module: the trainer says it
//! implements the variants, each variant is its own loss on one batch (from one snapshot),
//! constant-length and token-mean differ by their normalisers only, and a variant the
//! trainer cannot apply is refused in one line.

use crate::NativePlugin;
use tandem_conformance::{Source, TrainerHarness, TrainerSetup};
use tandem_plugin_api::sdk::module_of;
use tandem_plugin_api::{
    ErrorCode, KlEstimator, LossAggregation, LossKind, Metric, PolicyLoss, RatioLevel, TrainBatch,
    WhichWeights,
};

fn loss_of(metrics: &[Metric]) -> f64 {
    metrics
        .iter()
        .find(|m| m.name.as_str() == "loss")
        .map(|m| m.value)
        .expect("a loss metric")
}

#[test]
fn each_variant_is_its_own_loss_and_unusable_variants_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut setup = TrainerSetup::new(
        Source::Module(module_of::<NativePlugin>()),
        "native",
        tmp.path().join("model"),
    )
    .options(r#"{"init_preset": "tiny"}"#);
    // Completions of 6 and 2 tokens: the aggregations weigh them differently.
    setup.sequences = vec![
        (vec![5, 6, 7, 8, 9, 10, 11, 12], 2),
        (vec![9, 10, 11, 12, 13], 3),
    ];
    let mut h = TrainerHarness::new(setup).unwrap();
    assert!(h.config_caps.as_ref().is_some_and(|c| c.loss_variants));
    let lp = h
        .trainer
        .compute_logprobs(h.batch(None), WhichWeights::Current)
        .unwrap();
    let mut batch: TrainBatch = h.batch(Some(&lp));
    batch.loss.kl_coef = 0.1;
    for (i, s) in batch.sequences.iter_mut().enumerate() {
        // Ratios away from 1, varying along each sequence (so a sequence's ratio is not its
        // tokens'), and a reference below the policy: every term is non-zero.
        let shift = |j: usize| [0.1f32, -0.15][i] + 0.05 * (j % 3) as f32;
        let old = s.old_logprobs.iter().enumerate().map(|(j, x)| x - shift(j));
        s.old_logprobs = old.collect();
        s.ref_logprobs = s.old_logprobs.iter().map(|x| x - 0.2).collect();
    }
    h.trainer.snapshot("start".into()).unwrap();
    let mut step = |batch: &TrainBatch, loss: PolicyLoss| {
        h.trainer.restore("start".into()).unwrap();
        let m = h.trainer.train_step_policy(batch.clone(), loss);
        m.into_result().map(|m| loss_of(&m))
    };
    let default = step(&batch, PolicyLoss::default()).unwrap();
    let variant = |aggregation, constant_length, ratio, kl_estimator| PolicyLoss {
        aggregation,
        constant_length,
        ratio,
        kl_estimator,
    };
    use KlEstimator::*;
    use LossAggregation::*;
    use RatioLevel::*;
    let seq_mean = step(&batch, variant(SequenceMean, 0, Token, K3)).unwrap();
    let constant = step(&batch, variant(ConstantLength, 16, Token, K3)).unwrap();
    let gspo = step(&batch, variant(SequenceMean, 0, Sequence, K3)).unwrap();
    let k1 = step(&batch, variant(TokenMean, 0, Token, K1)).unwrap();
    let all = [default, seq_mean, constant, gspo, k1];
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a, b, "two variants gave one loss: {all:?}");
        }
    }
    // Σ mask·ℓ / 8 tokens vs Σ mask·ℓ / (2 sequences · 16).
    let rel = (constant * 32.0 - default * 8.0).abs() / (default * 8.0).abs();
    assert!(
        rel < 1e-6,
        "constant-length {constant} vs token-mean {default}"
    );

    let refused = |r: Result<f64, tandem_plugin_api::PluginError>, what: &str| {
        let e = r.expect_err("refused");
        assert_eq!(e.code, ErrorCode::InvalidInput, "{e:?}");
        assert!(e.message.contains(what), "{e:?}");
        assert_eq!(e.message.lines().count(), 1, "{e:?}");
    };
    refused(
        step(&batch, variant(ConstantLength, 0, Token, K3)),
        "constant_length > 0",
    );
    batch.loss.kind = LossKind::Sft;
    refused(
        step(&batch, variant(SequenceMean, 0, Token, K3)),
        "this batch is SFT",
    );
    assert!(
        step(&batch, PolicyLoss::default()).is_ok(),
        "SFT takes the default"
    );
}
