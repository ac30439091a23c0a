//! The trainer under test ([`TrainerHarness`]) and the trainer checks.

use crate::expect::{not_supported, ok, refused};
use crate::harness::{Failure, Outcome};
use crate::setup::{Groups, Parts, TrainerSetup, parts};
use tandem_plugin_api::{
    ComponentDecl, ComponentKind, ConfigCaps, ErrorCode, LossConfig, LossKind, Metric, PolicyLoss,
    RResult, RString, RVec, TrainBatch, TrainSequence, TrainerBox, TrainerInfo, UpdateKind,
    WhichWeights,
};
use tandem_services::Services;

/// A constructed, initialised trainer with the host's real services.
pub struct TrainerHarness {
    /// The trainer, as the host sees it.
    pub trainer: TrainerBox,
    /// Its declaration.
    pub decl: ComponentDecl,
    /// What `init` reported.
    pub info: TrainerInfo,
    /// What the plugin's `describe_config` answered for the setup's options (API level 5;
    /// `None`: the plugin does not say).
    pub config_caps: Option<ConfigCaps>,
    /// The services it was constructed with.
    pub services: Services,
    /// The setup it was built from.
    pub setup: TrainerSetup,
    /// Scratch directory (run dir, checkpoints).
    pub dir: tempfile::TempDir,
    /// Set once the run dir must outlive the harness (a check failed).
    keep: bool,
}

impl TrainerHarness {
    /// Loads the plugin, constructs the trainer and calls `init`.
    pub fn new(setup: TrainerSetup) -> Result<TrainerHarness, Failure> {
        Self::with_transport(setup, None)
    }

    /// [`TrainerHarness::new`] with `transport` groups attached to the trainer's services.
    pub(crate) fn with_transport(
        setup: TrainerSetup,
        transport: Option<Groups>,
    ) -> Result<TrainerHarness, Failure> {
        let Parts {
            module,
            decl,
            run_dir: dir,
            services,
            config,
        } = parts(
            &setup.source,
            ComponentKind::Trainer,
            &setup.component,
            &setup.model,
            &setup.options_json,
            transport,
        )?;
        let config_caps = match module.describe_config() {
            Some(describe) => ok(
                describe(ComponentKind::Trainer, config.clone()),
                "describe_config answers",
                "describe_config",
            )?
            .into_option(),
            None => None,
        };
        let mut trainer = ok(
            (module.new_trainer())(config, services.handle()),
            "the trainer constructs",
            "new_trainer",
        )?;
        let info = ok(trainer.init(), "the trainer initialises", "init")?;
        Ok(TrainerHarness {
            trainer,
            decl,
            info,
            config_caps,
            services,
            setup,
            dir,
            keep: false,
        })
    }

    /// The setup's sequences as a batch (GRPO loss, alternating advantages).
    pub fn batch(&self, old: Option<&[RVec<f32>]>) -> TrainBatch {
        let sequences = self
            .setup
            .sequences
            .iter()
            .enumerate()
            .map(|(i, (tokens, prompt_len))| TrainSequence {
                tokens: tokens.iter().copied().collect(),
                prompt_len: *prompt_len,
                advantage: if i % 2 == 0 { 1.0 } else { -1.0 },
                old_logprobs: old.and_then(|o| o.get(i).cloned()).unwrap_or_default(),
                ref_logprobs: RVec::new(),
            })
            .collect();
        TrainBatch {
            sequences,
            loss: LossConfig {
                kind: LossKind::Grpo,
                clip_eps_low: 0.2,
                clip_eps_high: 0.2,
                kl_coef: 0.0,
                learning_rate: self.setup.learning_rate,
                grad_clip: 1.0,
            },
        }
    }

    /// Logprobs of the setup's completions under the current weights.
    pub fn logprobs(&mut self, rule: &'static str) -> Result<Vec<Vec<f32>>, Failure> {
        let batch = self.batch(None);
        let lp = ok(
            self.trainer.compute_logprobs(batch, WhichWeights::Current),
            rule,
            "compute_logprobs",
        )?;
        Ok(lp.into_iter().map(RVec::into_vec).collect())
    }

    /// One GRPO step that must change the weights.
    pub fn train(&mut self, rule: &'static str) -> Outcome {
        let old = ok(
            self.trainer
                .compute_logprobs(self.batch(None), WhichWeights::Current),
            rule,
            "compute_logprobs",
        )?;
        let batch = self.batch(Some(&old));
        ok(self.trainer.train_step(batch), rule, "train_step").map(drop)
    }
}

impl TrainerHarness {
    /// Keeps the run directory (the component's logs) after the harness is dropped.
    pub fn keep_run_dir(&mut self) -> Option<std::path::PathBuf> {
        self.keep = true;
        Some(self.dir.path().to_path_buf())
    }
}

impl Drop for TrainerHarness {
    fn drop(&mut self) {
        if self.keep {
            self.dir.disable_cleanup(true);
        }
    }
}

/// `rule` holds when logprobs `got` differ from `want` by at most `limit` (`after` says after
/// what, for the failure).
fn unchanged(
    rule: &'static str,
    want: &[Vec<f32>],
    got: &[Vec<f32>],
    limit: f32,
    after: &str,
) -> Outcome {
    let d = max_diff(want, got);
    if d > limit {
        return Err(Failure::new(
            rule,
            format!("logprobs differ by {d} after {after}"),
        ));
    }
    Ok(())
}

/// Largest absolute difference of two logprob lists (infinite when their shapes differ).
/// A step's metrics as `(name, bits of the value)`, sorted: what two steps that must be the
/// same step compare bit for bit.
pub(crate) fn metric_bits(m: &[Metric]) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = m
        .iter()
        .map(|m| (m.name.to_string(), m.value.to_bits()))
        .collect();
    v.sort();
    v
}

pub(crate) fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.len() != y.len()) {
        return f32::INFINITY;
    }
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The trainer checks (with the feature trainer's, which the `features` group runs).
pub mod checks {
    use super::*;
    pub use crate::features::checks::{
        features_not_supported_unless_declared, save_load_and_offload, trains_on_features,
    };
    pub use crate::ppo::checks::{token_advantages_as_declared, value_model_as_declared};

    /// A second `init` is either refused or reports the same model.
    pub fn init_twice(h: &mut TrainerHarness) -> Outcome {
        match h.trainer.init() {
            RResult::ROk(again) => {
                if again.total_params != h.info.total_params
                    || again.trainable_params != h.info.trainable_params
                {
                    return Err(Failure::new(
                        "init twice is idempotent or refused",
                        format!("first init {:?}, second {again:?}", h.info),
                    ));
                }
                Ok(())
            }
            RResult::RErr(e) if e.code == ErrorCode::Panicked => {
                Err(Failure::new("no panic", e.message.to_string()))
            }
            RResult::RErr(_) => Ok(()),
        }
    }

    /// A train step changes the logprobs; restoring a snapshot taken before it brings them
    /// back bit-exact.
    pub fn snapshot_restore_round_trip(h: &mut TrainerHarness) -> Outcome {
        let rule = "snapshot/restore round trip";
        let before = h.logprobs(rule)?;
        ok(h.trainer.snapshot("conformance".into()), rule, "snapshot")?;
        h.train(rule)?;
        let trained = h.logprobs(rule)?;
        if max_diff(&before, &trained) == 0.0 {
            return Err(Failure::new(
                "a train step changes the weights",
                format!(
                    "logprobs identical after a step at lr {}",
                    h.setup.learning_rate
                ),
            ));
        }
        ok(h.trainer.restore("conformance".into()), rule, "restore")?;
        let back = h.logprobs(rule)?;
        unchanged(rule, &before, &back, 0.0, "restore")
    }

    /// `save_checkpoint` then `load_checkpoint` restores the weights and the weight version.
    pub fn save_load_keeps_version(h: &mut TrainerHarness) -> Outcome {
        let rule = "save/load keeps weights and version";
        h.train(rule)?;
        let dir = h.dir.path().join(format!("ckpt-{}", std::process::id()));
        let saved = ok(
            h.trainer.save_checkpoint(dir.display().to_string().into()),
            rule,
            "save_checkpoint",
        )?;
        let at_save = h.logprobs(rule)?;
        h.train(rule)?;
        let loaded = ok(
            h.trainer.load_checkpoint(dir.display().to_string().into()),
            rule,
            "load_checkpoint",
        )?;
        if loaded.weight_version != saved.weight_version {
            return Err(Failure::new(
                rule,
                format!(
                    "saved version {}, loaded version {}",
                    saved.weight_version, loaded.weight_version
                ),
            ));
        }
        let now = h.logprobs(rule)?;
        unchanged(rule, &at_save, &now, 1e-6, "loading the checkpoint")
    }

    /// Each declared releasable tag offloads and onloads with logprobs unchanged; undeclared
    /// tags are refused.
    pub fn offload_onload(h: &mut TrainerHarness) -> Outcome {
        let rule = "declared tags offload and onload bit-exact";
        let before = h.logprobs(rule)?;
        for tag in h.decl.caps.releasable_tags.clone() {
            let tags: RVec<RString> = RVec::from(vec![tag.clone()]);
            ok(
                h.trainer.offload(tags.clone()),
                rule,
                &format!("offload([{tag}])"),
            )?;
            ok(h.trainer.onload(tags), rule, &format!("onload([{tag}])"))?;
            let now = h.logprobs(rule)?;
            let after = format!("offloading and onloading `{tag}`");
            unchanged(rule, &before, &now, 0.0, &after)?;
        }
        for t in tandem_plugin_api::tags::ALL {
            if h.decl.caps.releasable_tags.iter().any(|d| d == t) {
                continue;
            }
            refused(
                h.trainer.offload(RVec::from(vec![RString::from(t)])),
                "undeclared tags are refused",
                &format!("offload([{t}]) of an undeclared tag"),
            )?;
        }
        Ok(())
    }

    /// A trainer whose `describe_config` answers `loss_variants` steps with
    /// `train_step_policy(batch, PolicyLoss::default())` exactly as with `train_step(batch)`:
    /// the same metrics and, from the same snapshot, the same weights after, bit for bit. One
    /// that does not say so answers `NotSupported`.
    pub fn policy_loss_default_is_train_step(h: &mut TrainerHarness) -> Outcome {
        let rule = "train_step_policy(default) is train_step";
        let old = ok(
            h.trainer
                .compute_logprobs(h.batch(None), WhichWeights::Current),
            rule,
            "compute_logprobs",
        )?;
        let batch = h.batch(Some(&old));
        if !h.config_caps.as_ref().is_some_and(|c| c.loss_variants) {
            return not_supported(
                h.trainer.train_step_policy(batch, PolicyLoss::default()),
                "train_step_policy (loss_variants not declared)",
            );
        }
        ok(
            h.trainer.snapshot("conformance-policy".into()),
            rule,
            "snapshot",
        )?;
        let plain = ok(h.trainer.train_step(batch.clone()), rule, "train_step")?;
        let after_plain = h.logprobs(rule)?;
        ok(
            h.trainer.restore("conformance-policy".into()),
            rule,
            "restore",
        )?;
        let policy = ok(
            h.trainer.train_step_policy(batch, PolicyLoss::default()),
            rule,
            "train_step_policy",
        )?;
        let after_policy = h.logprobs(rule)?;
        let (plain, policy) = (metric_bits(&plain), metric_bits(&policy));
        if plain != policy {
            return Err(Failure::new(
                rule,
                format!("train_step reported {plain:?}, train_step_policy(default) {policy:?}"),
            ));
        }
        unchanged(
            rule,
            &after_plain,
            &after_policy,
            0.0,
            "train_step_policy(default) vs train_step from one snapshot",
        )
    }

    /// Update kinds the trainer does not declare answer `NotSupported`.
    pub fn undeclared_exports(h: &mut TrainerHarness) -> Outcome {
        for kind in [
            UpdateKind::SharedRegion,
            UpdateKind::Adapter,
            UpdateKind::CheckpointDir,
            UpdateKind::TensorBuckets,
        ] {
            if !h.decl.caps.update_kinds.contains(&kind) {
                not_supported(
                    h.trainer.export_weight_update(kind),
                    &format!("export_weight_update({})", kind.as_str()),
                )?;
            }
        }
        Ok(())
    }
}
