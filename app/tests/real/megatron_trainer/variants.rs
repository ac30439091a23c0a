//! The policy-loss variants of test b: one step per variant on the GRPO batch, each from the
//! same weights (a snapshot restored before it), so the native, fsdp and megatron trainers are
//! compared on each variant the way they are on the default loss.

use crate::common::*;
use tandem_plugin_api::{
    KlEstimator, LossAggregation, PolicyLoss, RatioLevel, TrainBatch, TrainerBox,
};

/// A variant: its name, the `PolicyLoss`, and the clip range it uses (`None`: the batch's).
pub(super) type Variant = (&'static str, PolicyLoss, Option<(f32, f32)>);

/// The variants compared, as named in their papers.
pub(super) fn variants() -> Vec<Variant> {
    let loss = |aggregation, constant_length, ratio, kl_estimator| PolicyLoss {
        aggregation,
        constant_length,
        ratio,
        kl_estimator,
    };
    use KlEstimator::*;
    use LossAggregation::*;
    use RatioLevel::*;
    vec![
        ("default (train_step_policy)", PolicyLoss::default(), None),
        ("sequence-mean", loss(SequenceMean, 0, Token, K3), None),
        (
            "Dr. GRPO constant-length 16",
            loss(ConstantLength, 16, Token, K3),
            None,
        ),
        // GSPO's own clip range: most sequences clip, some do not.
        (
            "GSPO sequence ratio",
            loss(SequenceMean, 0, Sequence, K3),
            Some((3e-4, 4e-4)),
        ),
        ("k1 KL", loss(TokenMean, 0, Token, K1), None),
        (
            "DAPO clip-higher 0.2/0.28",
            PolicyLoss::default(),
            Some((0.2, 0.28)),
        ),
    ]
}

/// `[loss, grad_norm, kl, clip_frac]` of `train_step(batch)`, then of each variant's
/// `train_step_policy`, every step from the weights `t` has now.
pub(super) fn figures(t: &mut TrainerBox, batch: &TrainBatch) -> Vec<[f64; 4]> {
    ok(t.snapshot("variants".into()));
    let mut out = vec![super::step_figures(&ok(t.train_step(batch.clone())))];
    for (_, loss, clip) in variants() {
        ok(t.restore("variants".into()));
        let mut b = batch.clone();
        if let Some((low, high)) = clip {
            (b.loss.clip_eps_low, b.loss.clip_eps_high) = (low, high);
        }
        out.push(super::step_figures(&ok(t.train_step_policy(b, loss))));
    }
    out
}
