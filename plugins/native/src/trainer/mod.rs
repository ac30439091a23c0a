//! The `native` trainer component: [`TrainerImpl`] over the core [`Trainer`].
//!
//! Full fine-tuning exports `CheckpointDir` updates; LoRA mode (`options.lora`) trains an
//! adapter on a frozen base and exports `Adapter` updates. Snapshots go through the host
//! (tags `weights` + `optimizer`) when memory services are attached, else they are in-plugin
//! copies of the parameters and the optimizer step (moments are not copied: a gap).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use tandem_native_core::buffer::BufferTag;
use tandem_native_core::lora::{LoraAdapter, LoraConfig};
use tandem_native_core::loss::{Aggregation, KlEstimator, Loss, PolicyLossConfig, RatioLevel};
use tandem_native_core::model::Model;
use tandem_native_core::optim::AdamW;
use tandem_native_core::trainer::{MicroBatch, Trainer};
use tandem_plugin_api::sdk::{Result, TrainerImpl};
use tandem_plugin_api::{
    CheckpointInfo, ComponentConfig, ComponentStats, HostBox, LogLevel, LossKind, Metric,
    PluginError, PolicyLoss, RString, RVec, TokenAdvantages, TrainBatch, TrainerInfo, UpdateKind,
    ValueTargets, WeightUpdate, WhichWeights,
};

pub(crate) mod create;
mod critic;
mod export;
mod options;
mod st_write;
pub(crate) mod state;

use super::batch::Padded;
use super::common::{Ctx, check_tags, host_call, log, parse_options};
use super::provider::{Backing, PluginProvider};
use options::parse_targets;
pub use options::{LoraOptions, TrainerOptions};

/// Tags the trainer can offload.
pub const OFFLOADABLE: [&str; 4] = ["weights", "grads", "optimizer", "activations"];
const SNAPSHOT_TAGS: [&str; 2] = ["weights", "optimizer"];
const SCRATCH_SNAPSHOT: &str = "native.trainer/scratch";
use tandem_plugin_api::files::state::STATE_FILE;

/// In-plugin snapshot (Vec backing) or the metadata of a host snapshot.
struct Snap {
    params: Option<(Vec<f32>, Option<Vec<f32>>)>,
    /// Whether the trainer had a value head, and its parameters (in-plugin snapshots only).
    head: (bool, Option<Vec<f32>>),
    step: u64,
    version: u64,
}

/// The trainer component.
pub struct NativeTrainer {
    config: ComponentConfig,
    opts: TrainerOptions,
    host: HostBox,
    provider: Option<PluginProvider>,
    trainer: Option<Trainer>,
    version: u64,
    snapshots: HashMap<String, Snap>,
    offloaded: BTreeSet<String>,
    /// The key of the region whose tensor layout the last `SharedRegion` export carried:
    /// later exports of the same region leave the layout out (it cannot change).
    layout_sent: Option<String>,
}

impl NativeTrainer {
    /// Parses the options and, with `init_preset`, writes that preset into an absent or empty
    /// model directory; the model is loaded by `init`.
    pub fn new(config: ComponentConfig, host: HostBox) -> Result<Self> {
        let opts: TrainerOptions = parse_options(&config.options_json, "trainer `native`")?;
        if config.model_path.is_empty() {
            return Err(PluginError::invalid_input(
                "trainer `native` needs a model directory (model_path is empty)",
            ));
        }
        let preset = create::preset_of(&opts).map_err(|p| p.to_error("trainer `native`"))?;
        if let Some(preset) = preset {
            let dir = Path::new(config.model_path.as_str());
            if create::create_if_absent(dir, preset, opts.init_seed)? {
                let msg = format!(
                    "trainer: wrote init preset `{}` (seed {}) into {}",
                    preset.name(),
                    opts.init_seed,
                    dir.display()
                );
                log(&host, LogLevel::Info, &msg);
            }
        }
        Ok(NativeTrainer {
            config,
            opts,
            host,
            provider: None,
            trainer: None,
            version: 0,
            snapshots: HashMap::new(),
            offloaded: BTreeSet::new(),
            layout_sent: None,
        })
    }

    fn ready(&mut self, op: &str) -> Result<(&mut Trainer, &mut PluginProvider)> {
        if !self.offloaded.is_empty() {
            return Err(PluginError::invalid_state(format!(
                "{op}: {:?} are offloaded; call onload first",
                self.offloaded
            )));
        }
        match (self.trainer.as_mut(), self.provider.as_mut()) {
            (Some(t), Some(p)) => Ok((t, p)),
            _ => Err(PluginError::invalid_state(format!(
                "{op}: trainer `native` is not initialised; call init first"
            ))),
        }
    }

    fn host_backed(&self) -> bool {
        self.provider
            .as_ref()
            .is_some_and(|p| p.backing() == Backing::Host)
    }

    fn logprobs_current(&mut self, batch: &TrainBatch) -> Result<Vec<RVec<f32>>> {
        let (tr, p) = self.ready("compute_logprobs")?;
        let pad = Padded::new(&batch.sequences, tr.model.cfg.vocab_size)?;
        let b = pad.batch();
        let lp = tr.logprobs(&b, p).ctx("compute_logprobs")?;
        Ok(pad.completions(&lp).into_iter().map(RVec::from).collect())
    }

    /// A policy step; `token_adv`: per-token advantages (`train_step_advantages`) instead of
    /// each sequence's.
    fn train(
        &mut self,
        batch: &TrainBatch,
        policy: PolicyLoss,
        token_adv: Option<&TokenAdvantages>,
    ) -> Result<Vec<Metric>> {
        let lc = batch.loss.clone();
        if token_adv.is_some() && lc.kind == LossKind::Sft {
            return Err(PluginError::invalid_input(
                "train_step_advantages: per-token advantages apply to the GRPO loss, this batch \
                 is SFT",
            ));
        }
        let variant = policy_variant(&lc, policy)?;
        if !(lc.learning_rate > 0.0 && lc.learning_rate.is_finite()) {
            return Err(PluginError::invalid_input(format!(
                "train_step: learning_rate must be > 0 (got {})",
                lc.learning_rate
            )));
        }
        let (tr, p) = self.ready("train_step")?;
        let pad = Padded::new(&batch.sequences, tr.model.cfg.vocab_size)?;
        let b = pad.batch();
        tr.opt.lr = lc.learning_rate;
        tr.max_grad_norm = (lc.grad_clip > 0.0).then_some(lc.grad_clip);
        let seqs = &batch.sequences;
        let (stats, step) = match lc.kind {
            LossKind::Sft => tr.train_step(&b, &Loss::Sft, p).ctx("train_step")?,
            LossKind::Grpo => {
                let adv: Vec<f32> = match token_adv {
                    Some(a) => pad.scatter_rows(&a.rows, "advantages")?,
                    None => seqs
                        .iter()
                        .flat_map(|s| std::iter::repeat_n(s.advantage, pad.t))
                        .collect(),
                };
                let old = match pad.scatter(seqs, "old_logprobs", |s| &s.old_logprobs)? {
                    Some(o) => o,
                    // On-policy: the behaviour policy is the current one.
                    None => tr.logprobs(&b, p).ctx("train_step")?,
                };
                let refs = pad.scatter(seqs, "ref_logprobs", |s| &s.ref_logprobs)?;
                if lc.kl_coef > 0.0 && refs.is_none() {
                    return Err(PluginError::invalid_input(
                        "train_step: kl_coef > 0 needs ref_logprobs on every sequence",
                    ));
                }
                let loss = Loss::Policy {
                    cfg: PolicyLossConfig {
                        clip_low: lc.clip_eps_low,
                        clip_high: lc.clip_eps_high,
                        kl_coef: lc.kl_coef,
                        ..variant
                    },
                    advantages: &adv,
                    old_logprobs: &old,
                    ref_logprobs: refs.as_deref(),
                };
                tr.train_step(&b, &loss, p).ctx("train_step")?
            }
        };
        if step.applied {
            self.version += 1;
        }
        Ok(vec![
            Metric::new("loss", stats.loss),
            Metric::new("nll", stats.nll),
            Metric::new("kl", stats.kl),
            Metric::new("clip_frac", stats.clip_frac),
            Metric::new("tokens", stats.tokens),
            Metric::new("grad_norm", step.grad_norm),
            Metric::new("applied", step.applied as u8 as f64),
            Metric::new("weight_version", self.version as f64),
        ])
    }
}

/// The core's loss settings of a policy-loss variant (clip and KL weight come from the
/// batch's `LossConfig`); a variant the batch cannot take is refused in one line.
fn policy_variant(lc: &tandem_plugin_api::LossConfig, p: PolicyLoss) -> Result<PolicyLossConfig> {
    use tandem_plugin_api::{KlEstimator as K, LossAggregation as A, RatioLevel as R};
    if let Some(problem) = p.problem(lc.kind) {
        return Err(PluginError::invalid_input(format!(
            "train_step_policy: {problem}"
        )));
    }
    Ok(PolicyLossConfig {
        aggregation: match p.aggregation {
            A::TokenMean => Aggregation::TokenMean,
            A::SequenceMean => Aggregation::SequenceMean,
            A::ConstantLength => Aggregation::ConstantLength(p.constant_length as f32),
        },
        ratio: match p.ratio {
            R::Token => RatioLevel::Token,
            R::Sequence => RatioLevel::Sequence,
        },
        kl: match p.kl_estimator {
            K::K1 => KlEstimator::K1,
            K::K3 => KlEstimator::K3,
        },
        ..PolicyLossConfig::default()
    })
}

fn tags_of(tags: &[String]) -> RVec<RString> {
    tags.iter().map(|t| RString::from(t.as_str())).collect()
}

impl TrainerImpl for NativeTrainer {
    fn component(&self) -> &str {
        "native"
    }

    fn init(&mut self) -> Result<TrainerInfo> {
        if self.trainer.is_some() {
            return Err(PluginError::invalid_state(
                "trainer `native` is already initialised",
            ));
        }
        let dir = PathBuf::from(self.config.model_path.as_str());
        let mut provider =
            PluginProvider::new(self.host.clone(), "trainer").ctx("trainer `native`")?;
        let what = format!("loading model {}", dir.display());
        let model = Model::load(&dir, &mut provider).ctx(&what)?;
        let lora = match &self.opts.lora {
            None => None,
            Some(o) => {
                let cfg = LoraConfig {
                    r: o.rank,
                    alpha: o.alpha,
                    targets: parse_targets(&o.targets)?,
                    base_model: dir.display().to_string(),
                };
                let mut ad = LoraAdapter::new(&model.cfg, cfg, &mut provider)
                    .ctx("trainer `native` lora")?;
                ad.init_a(o.seed);
                Some(ad)
            }
        };
        let o = &self.opts;
        let opt = AdamW {
            lr: 0.0,
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.eps,
            weight_decay: o.weight_decay,
            step: 0,
        };
        let total = model.layout.num_params() as u64;
        let adapter = lora.as_ref().map(|l| l.layout.num_params() as u64);
        let mut trainer = Trainer::new(model, lora, opt, &mut provider).ctx("trainer `native`")?;
        trainer.micro_batch = MicroBatch {
            tokens: o.micro_batch_tokens.unwrap_or(usize::MAX).max(1),
            sequences: o.micro_batch_sequences.unwrap_or(usize::MAX).max(1),
        };
        trainer.head_budget_bytes = o.head_chunk_mib.max(1) << 20;
        if let Some(tokens) = o.micro_batch_tokens {
            trainer
                .reserve_activations(tokens, &mut provider)
                .ctx("trainer `native` activations")?;
        }
        log(
            &self.host,
            LogLevel::Info,
            &format!(
                "trainer: {} loaded ({}, buffers: {})",
                dir.display(),
                if adapter.is_some() {
                    "LoRA"
                } else {
                    "full fine-tuning"
                },
                provider.backing().as_str()
            ),
        );
        self.trainer = Some(trainer);
        self.provider = Some(provider);
        // A model directory exported by an earlier run carries its weight version: versions
        // keep going up across restarts.
        if let Some(v) = tandem_plugin_api::files::state::saved_version(&dir) {
            self.version = self.version.max(v);
        }
        Ok(TrainerInfo {
            trainable_params: adapter.unwrap_or(total),
            total_params: total + adapter.unwrap_or(0),
            weight_version: self.version,
        })
    }

    fn compute_logprobs(
        &mut self,
        batch: TrainBatch,
        which: WhichWeights,
    ) -> Result<Vec<RVec<f32>>> {
        match which {
            WhichWeights::Current => self.logprobs_current(&batch),
            WhichWeights::Snapshot(name) => {
                self.take_snapshot(SCRATCH_SNAPSHOT)?;
                let out = self
                    .restore_snapshot(name.as_str(), false)
                    .and_then(|()| self.logprobs_current(&batch));
                let back = self.restore_snapshot(SCRATCH_SNAPSHOT, false);
                self.snapshots.remove(SCRATCH_SNAPSHOT);
                if self.host_backed() {
                    host_call(
                        self.host.drop_snapshot(SCRATCH_SNAPSHOT.into()),
                        "compute_logprobs",
                    )?;
                }
                back?;
                out
            }
        }
    }

    fn train_step(&mut self, batch: TrainBatch) -> Result<Vec<Metric>> {
        self.train(&batch, PolicyLoss::default(), None)
    }

    fn train_step_policy(&mut self, batch: TrainBatch, loss: PolicyLoss) -> Result<Vec<Metric>> {
        self.train(&batch, loss, None)
    }

    fn train_step_advantages(
        &mut self,
        batch: TrainBatch,
        loss: PolicyLoss,
        advantages: TokenAdvantages,
    ) -> Result<Vec<Metric>> {
        self.train(&batch, loss, Some(&advantages))
    }

    fn compute_values(&mut self, batch: TrainBatch) -> Result<Vec<RVec<f32>>> {
        self.values(&batch)
    }

    fn train_step_value(
        &mut self,
        batch: TrainBatch,
        targets: ValueTargets,
    ) -> Result<Vec<Metric>> {
        self.train_value(&batch, &targets)
    }

    fn snapshot(&mut self, name: String) -> Result<()> {
        if name == SCRATCH_SNAPSHOT {
            return Err(PluginError::invalid_input(format!(
                "snapshot name `{name}` is reserved"
            )));
        }
        if self.snapshots.contains_key(&name) && self.host_backed() {
            host_call(self.host.drop_snapshot(name.as_str().into()), "snapshot")?;
        }
        self.take_snapshot(&name)
    }

    fn restore(&mut self, name: String) -> Result<()> {
        self.ready("restore")?;
        self.restore_snapshot(&name, true)
    }

    fn save_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        self.save(Path::new(&dir))
    }

    fn load_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        self.load(Path::new(&dir))
    }

    fn export_weight_update(&mut self, kind: UpdateKind) -> Result<WeightUpdate> {
        self.export(kind)
    }

    fn offload(&mut self, tags: Vec<String>) -> Result<()> {
        check_tags(&tags, &OFFLOADABLE, "offload")?;
        if !self.host_backed() {
            return Err(not_host("offload"));
        }
        let fresh: Vec<String> = tags
            .into_iter()
            .filter(|t| !self.offloaded.contains(t))
            .collect();
        if !fresh.is_empty() {
            host_call(self.host.pause_tags(tags_of(&fresh)), "offload")?;
        }
        self.offloaded.extend(fresh);
        Ok(())
    }

    fn onload(&mut self, tags: Vec<String>) -> Result<()> {
        check_tags(&tags, &OFFLOADABLE, "onload")?;
        if !self.host_backed() {
            return Err(not_host("onload"));
        }
        let held: Vec<String> = tags
            .into_iter()
            .filter(|t| self.offloaded.contains(t))
            .collect();
        if !held.is_empty() {
            host_call(self.host.resume_tags(tags_of(&held)), "onload")?;
        }
        for t in &held {
            self.offloaded.remove(t);
        }
        Ok(())
    }

    fn stats(&self) -> Result<ComponentStats> {
        let state = match (&self.trainer, self.offloaded.is_empty()) {
            (None, _) => "uninitialised".to_string(),
            (Some(_), true) => "ready".to_string(),
            (Some(_), false) => format!(
                "offloaded: {}",
                self.offloaded.iter().cloned().collect::<Vec<_>>().join(",")
            ),
        };
        let mut metrics = Vec::new();
        if let Some(t) = &self.trainer {
            metrics.push(Metric::new("optimizer_step", t.opt.step as f64));
        }
        if let Some(p) = &self.provider {
            metrics.push(Metric::new(
                "host_regions",
                (p.backing() == Backing::Host) as u8 as f64,
            ));
            for tag in [
                BufferTag::Weights,
                BufferTag::Grads,
                BufferTag::Optimizer,
                BufferTag::Activations,
            ] {
                metrics.push(Metric::new(
                    &format!("allocated_bytes.{}", tag.as_str()),
                    p.bytes(tag) as f64,
                ));
            }
        }
        metrics.push(Metric::new("snapshots", self.snapshots.len() as f64));
        Ok(ComponentStats {
            weight_version: self.version,
            state: state.into(),
            metrics: metrics.into(),
        })
    }
}

fn not_host(op: &str) -> PluginError {
    PluginError::new(
        tandem_plugin_api::ErrorCode::NotAvailable,
        format!("{op}: this trainer's buffers are heap vectors (no host memory services)"),
    )
    .with_help("run the trainer inside a `tandem worker` process, which attaches memory services")
}
