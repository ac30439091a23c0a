//! Checks of a trainer that steps on hidden states (`train_step_features`, API level 3, e.g. a
//! drafter trainer): it says which features it reads, trains on them, refuses features that
//! do not fit, round-trips checkpoints, and offloads what it declares. A trainer that does not
//! declare `hidden_states` answers `NotSupported` (a check of the `trainer` group).

use crate::expect::{not_supported, ok, refused};
use crate::harness::{Failure, Outcome};
use crate::trainer::TrainerHarness;
use tandem_plugin_api::{
    ComponentStats, FeatureBatch, FeatureRoute, FeatureSource, LossConfig, LossKind, Metric,
    RString, RVec, TrainBatch, TrainSequence, stats,
};

/// The layers and row width the trainer reports in its stats.
fn inputs(h: &TrainerHarness) -> Result<(Vec<u32>, u32), Failure> {
    let rule = "a feature trainer reports its layers and row width";
    let s: ComponentStats = ok(h.trainer.stats(), rule, "stats")?;
    let get = |n: &str| {
        s.metrics
            .iter()
            .find(|m| m.name.as_str() == n)
            .map(|m| m.value)
    };
    let mut layers = Vec::new();
    while let Some(v) = get(&format!("{}{}", stats::AUX_LAYER, layers.len())) {
        layers.push(v as u32);
    }
    let width = get(stats::FEATURE_WIDTH).unwrap_or(0.0) as u32;
    if layers.is_empty() || width == 0 {
        return Err(Failure::new(
            rule,
            format!(
                "stats lack `{}<i>` or `{}`",
                stats::AUX_LAYER,
                stats::FEATURE_WIDTH
            ),
        ));
    }
    Ok((layers, width))
}

/// The setup's sequences (SFT loss settings) and deterministic features for them: `extra`
/// rows more than the batch needs.
fn batch(h: &TrainerHarness, layers: &[u32], width: u32, extra: u64) -> (TrainBatch, FeatureBatch) {
    let seqs: Vec<TrainSequence> = h
        .setup
        .sequences
        .iter()
        .map(|(t, p)| TrainSequence {
            tokens: t.iter().copied().collect(),
            prompt_len: *p,
            advantage: 0.0,
            old_logprobs: RVec::new(),
            ref_logprobs: RVec::new(),
        })
        .collect();
    let rows: u64 = seqs.iter().map(|s| s.tokens.len() as u64).sum::<u64>() + extra;
    let n = rows as usize * width as usize;
    // A fixed, bounded, non-trivial pattern (no RNG dependency).
    let features: Vec<f32> = (0..n)
        .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * 2.0)
        .collect();
    let train = TrainBatch {
        sequences: RVec::from(seqs),
        loss: LossConfig {
            kind: LossKind::Sft,
            clip_eps_low: 0.0,
            clip_eps_high: 0.0,
            kl_coef: 0.0,
            learning_rate: h.setup.learning_rate,
            grad_clip: 1.0,
        },
    };
    let features = FeatureBatch {
        width,
        layers: RVec::from(layers.to_vec()),
        sources: RVec::from(vec![FeatureSource {
            route: FeatureRoute::Inline,
            rows,
            features: RVec::from(features),
        }]),
    };
    (train, features)
}

fn loss(metrics: &[Metric], rule: &'static str) -> Result<f64, Failure> {
    metrics
        .iter()
        .find(|m| m.name.as_str() == "loss")
        .map(|m| m.value)
        .filter(|v| v.is_finite())
        .ok_or_else(|| Failure::new(rule, "no finite `loss` metric"))
}

/// The checks of a feature trainer.
pub mod checks {
    use super::*;

    /// Two steps on the same features train (finite losses, the second lower); features that
    /// do not fit the batch, the trainer's layers or its width are refused.
    pub fn trains_on_features(h: &mut TrainerHarness) -> Outcome {
        let rule = "train_step_features trains on fitting features";
        let (layers, width) = inputs(h)?;
        let (b, f) = batch(h, &layers, width, 0);
        let first = ok(
            h.trainer.train_step_features(b.clone(), f.clone()),
            rule,
            "train_step_features",
        )?;
        let second = ok(
            h.trainer.train_step_features(b.clone(), f.clone()),
            rule,
            "train_step_features",
        )?;
        let (l1, l2) = (loss(&first, rule)?, loss(&second, rule)?);
        if l2 >= l1 {
            return Err(Failure::new(
                rule,
                format!("the loss did not fall on the same batch: {l1} -> {l2}"),
            ));
        }
        let (b2, f2) = batch(h, &layers, width, 3);
        refused(
            h.trainer.train_step_features(b2, f2),
            "features that do not fit are refused",
            "train_step_features with 3 rows too many",
        )?;
        let mut other = f.clone();
        other.layers = RVec::from(vec![u32::MAX; layers.len()]);
        refused(
            h.trainer.train_step_features(b.clone(), other),
            "features that do not fit are refused",
            "train_step_features of other layers",
        )?;
        let mut wide = f;
        wide.width += 1;
        refused(
            h.trainer.train_step_features(b, wide),
            "features that do not fit are refused",
            "train_step_features of another width",
        )
        .map(drop)
    }

    /// `save_checkpoint` then `load_checkpoint` keeps the version; a step after works.
    pub fn save_load_and_offload(h: &mut TrainerHarness) -> Outcome {
        let rule = "a feature trainer saves, loads and offloads";
        let (layers, width) = inputs(h)?;
        let dir = h
            .dir
            .path()
            .join(format!("features-{}", std::process::id()));
        let saved = ok(
            h.trainer.save_checkpoint(dir.display().to_string().into()),
            rule,
            "save_checkpoint",
        )?;
        let loaded = ok(
            h.trainer.load_checkpoint(dir.display().to_string().into()),
            rule,
            "load_checkpoint",
        )?;
        if loaded.weight_version != saved.weight_version {
            return Err(Failure::new(
                rule,
                format!(
                    "saved version {}, loaded {}",
                    saved.weight_version, loaded.weight_version
                ),
            ));
        }
        for tag in h.decl.caps.releasable_tags.clone() {
            let tags: RVec<RString> = RVec::from(vec![tag.clone()]);
            ok(
                h.trainer.offload(tags.clone()),
                rule,
                &format!("offload([{tag}])"),
            )?;
            ok(h.trainer.onload(tags), rule, &format!("onload([{tag}])"))?;
        }
        let (b, f) = batch(h, &layers, width, 0);
        ok(
            h.trainer.train_step_features(b, f),
            rule,
            "train_step_features",
        )
        .map(drop)
    }

    /// A trainer that does not declare `hidden_states` answers `NotSupported`.
    pub fn features_not_supported_unless_declared(h: &mut TrainerHarness) -> Outcome {
        if h.decl.caps.hidden_states {
            return Ok(());
        }
        let (b, mut f) = batch(h, &[0], 1, 0);
        f.sources = RVec::new();
        not_supported(h.trainer.train_step_features(b, f), "train_step_features")
    }
}
