//! The `native-drafter` trainer component: an EAGLE-3 drafter for a fixed target model,
//! trained on the target's hidden states (`train_step_features`), its buffers in host regions
//! like every native buffer (`weights`, `grads`, `optimizer`, `activations`; the features'
//! receive region is `activations/features`).
//!
//! `init` loads the target only to take its embedding, final norm and lm_head (dropped
//! again), builds the drafter (fresh, or `options.drafter`), allocates the receive region
//! for `options.max_tokens` rows and warms the trainer up at that size, so memory is at its
//! peak once `init` returns. A step receives each source's rows straight into the receive
//! region — over the transport (`host.recv` on the source's group, the engine's rank, the
//! step's tag) or from the batch (`Inline`) — then takes one optimiser step. Exports are
//! drafter directories (`CheckpointDir`) under `<run_dir>/drafter-sync/v<N>`, the two newest
//! kept.

mod options;
mod validate;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tandem_native_core::buffer::{BufferProvider, BufferTag, Region, VecProvider};
use tandem_native_core::drafter::{Drafter, DrafterInit, DrafterTrainer, SeqFeatures, TttConfig};
use tandem_native_core::model::Model;
use tandem_native_core::optim::AdamW;
use tandem_plugin_api::files::dir_bytes;
use tandem_plugin_api::sdk::{Result, TrainerImpl};
use tandem_plugin_api::stats;
use tandem_plugin_api::{
    CheckpointInfo, ComponentConfig, ComponentStats, FeatureBatch, FeatureRoute, HostBox, LogLevel,
    Metric, PluginError, RString, RVec, TrainBatch, TrainerInfo, UpdateKind, UpdatePayload,
    WeightUpdate,
};

use crate::common::{Ctx, check_tags, host_call, log, parse_options};
use crate::provider::{Backing, PluginProvider};
pub use options::DrafterOptions;
pub use validate::{drafter_dir_problem, validate_config};

/// The component's name.
pub const COMPONENT: &str = "native-drafter";
/// Tags the drafter trainer can offload.
pub const OFFLOADABLE: [&str; 4] = ["weights", "grads", "optimizer", "activations"];
/// Drafter directories kept under `<run_dir>/drafter-sync`.
const KEEP_SYNCS: u64 = 2;

/// The initialised state.
struct Ready {
    provider: PluginProvider,
    trainer: DrafterTrainer,
    /// `[max_tokens, feature width]` receive region.
    features: Box<dyn Region>,
    width: usize,
    steps: u64,
}

/// The `native-drafter` trainer component.
pub struct NativeDrafterTrainer {
    config: ComponentConfig,
    opts: DrafterOptions,
    host: HostBox,
    ready: Option<Ready>,
    version: u64,
    offloaded: BTreeSet<String>,
}

fn what() -> String {
    format!("trainer `{COMPONENT}`")
}

impl NativeDrafterTrainer {
    /// Parses the options; the target and the drafter are loaded by `init`.
    pub fn new(config: ComponentConfig, host: HostBox) -> Result<Self> {
        let opts: DrafterOptions = parse_options(&config.options_json, &what())?;
        if config.model_path.is_empty() {
            return Err(PluginError::invalid_input(format!(
                "{} needs the target model's directory (model_path is empty)",
                what()
            )));
        }
        Ok(NativeDrafterTrainer {
            config,
            opts,
            host,
            ready: None,
            version: 0,
            offloaded: BTreeSet::new(),
        })
    }

    fn ready(&mut self) -> Result<&mut Ready> {
        self.ready.as_mut().ok_or_else(|| {
            PluginError::invalid_state(format!("{} is not initialised; call init first", what()))
        })
    }

    fn host_backed(&self) -> bool {
        self.ready
            .as_ref()
            .is_some_and(|r| r.provider.backing() == Backing::Host)
    }

    /// The drafter: from `options.drafter`, or fresh from the target.
    fn build_drafter(&self, provider: &mut PluginProvider) -> Result<Drafter> {
        let dir = PathBuf::from(self.config.model_path.as_str());
        // The target is read into heap buffers and dropped once the drafter has taken its
        // embedding (and its norm and lm_head for a fresh drafter).
        let target = Model::load(&dir, &mut VecProvider::new())
            .ctx(&format!("loading target {}", dir.display()))?;
        let drafter = match &self.opts.drafter {
            Some(d) => {
                let d = Path::new(d);
                Drafter::load(d, Some(&target), provider).ctx(&format!(
                    "{}: loading drafter {}",
                    what(),
                    d.display()
                ))?
            }
            None => Drafter::init_from_target(
                &target,
                DrafterInit {
                    aux_layers: self.opts.aux_layers,
                    draft_vocab: None,
                    seed: self.opts.seed,
                },
                provider,
            )
            .ctx(&format!("{}: a drafter for {}", what(), dir.display()))?,
        };
        Ok(drafter)
    }
}

impl TrainerImpl for NativeDrafterTrainer {
    fn component(&self) -> &str {
        COMPONENT
    }

    fn init(&mut self) -> Result<TrainerInfo> {
        if self.ready.is_some() {
            return Err(PluginError::invalid_state(format!(
                "{} is already initialised",
                what()
            )));
        }
        let mut provider = PluginProvider::new(self.host.clone(), "trainer").ctx(&what())?;
        let drafter = self.build_drafter(&mut provider)?;
        let o = &self.opts;
        let width = drafter.cfg.feat_dim();
        let total = drafter.layout.num_params() as u64;
        let trainable = drafter.trainable_len() as u64;
        let ttt = TttConfig {
            steps: o.ttt_steps,
            max_tokens: o.max_tokens,
        };
        let opt = AdamW {
            lr: 0.0,
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.eps,
            weight_decay: o.weight_decay,
            step: 0,
        };
        let mut trainer = DrafterTrainer::new(drafter, ttt, opt, &mut provider).ctx(&what())?;
        let mut features = provider
            .alloc(
                BufferTag::Activations,
                "activations/features",
                o.max_tokens * width,
            )
            .ctx(&what())?;
        // Pre-warm: every page of the receive region and the trainer's peak, now.
        features.as_mut_slice().fill(0.0);
        trainer.warm_up().ctx(&format!("{}: warm-up", what()))?;
        log(
            &self.host,
            LogLevel::Info,
            &format!(
                "{}: drafter of {trainable} trainable parameters, aux layers {:?}, {} TTT steps, \
                 {} feature rows of {width} (buffers: {})",
                what(),
                trainer.drafter.aux_layers(),
                o.ttt_steps,
                o.max_tokens,
                provider.backing().as_str()
            ),
        );
        self.ready = Some(Ready {
            provider,
            trainer,
            features,
            width,
            steps: 0,
        });
        Ok(TrainerInfo {
            trainable_params: trainable,
            total_params: total,
            weight_version: self.version,
        })
    }

    fn train_step(&mut self, _batch: TrainBatch) -> Result<Vec<Metric>> {
        Err(PluginError::not_supported("train_step", COMPONENT).with_help(
            "a drafter trains on hidden states: train_step_features ([algorithm] name = \"drafter\")",
        ))
    }

    fn train_step_features(
        &mut self,
        batch: TrainBatch,
        features: FeatureBatch,
    ) -> Result<Vec<Metric>> {
        let host = self.host.clone();
        if !self.offloaded.is_empty() {
            return Err(PluginError::invalid_state(format!(
                "train_step_features: {} are offloaded; onload them first",
                self.offloaded
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let r = self.ready()?;
        let layers: Vec<u32> = r
            .trainer
            .drafter
            .aux_layers()
            .iter()
            .map(|&l| l as u32)
            .collect();
        if features.layers.as_slice() != layers.as_slice() || features.width as usize != r.width {
            return Err(PluginError::invalid_input(format!(
                "train_step_features: features of layers {:?} ({} per row); the drafter reads \
                 layers {layers:?} ({} per row)",
                features.layers.as_slice(),
                features.width,
                r.width
            )));
        }
        let rows: usize = batch.sequences.iter().map(|s| s.tokens.len()).sum();
        if rows as u64 != features.rows() {
            return Err(PluginError::invalid_input(format!(
                "train_step_features: the batch has {rows} tokens but the features {} rows",
                features.rows()
            )));
        }
        let capacity = r.features.len() / r.width.max(1);
        if rows > capacity {
            return Err(PluginError::invalid_input(format!(
                "train_step_features: {rows} feature rows exceed the trainer's max_tokens \
                 {capacity}"
            ))
            .with_help("raise [trainer.options] max_tokens, or lower prompts_per_step"));
        }
        let t = Instant::now();
        let buf = r.features.as_mut_slice();
        let mut off = 0;
        for (i, src) in features.sources.iter().enumerate() {
            let n = src.rows as usize * r.width;
            let dst = &mut buf[off..off + n];
            match &src.route {
                FeatureRoute::Inline => {
                    if src.features.len() != n {
                        return Err(PluginError::invalid_input(format!(
                            "train_step_features: source {i} carries {} values for {} rows of {}",
                            src.features.len(),
                            src.rows,
                            r.width
                        )));
                    }
                    dst.copy_from_slice(&src.features);
                }
                FeatureRoute::Transport { group, peer, tag } => {
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
                    host_call(
                        host.recv(group.as_str().into(), *peer, bytes.into(), *tag),
                        &format!("train_step_features: features of source {i} ({group})"),
                    )?;
                }
            }
            off += n;
        }
        let recv_s = t.elapsed().as_secs_f64();
        let buf: &[f32] = r.features.as_slice();
        let mut seqs = Vec::with_capacity(batch.sequences.len());
        let mut row = 0;
        for s in batch.sequences.iter() {
            let len = s.tokens.len();
            seqs.push(SeqFeatures {
                tokens: &s.tokens,
                feats: &buf[row * r.width..(row + len) * r.width],
                prompt_len: s.prompt_len as usize,
            });
            row += len;
        }
        let lr = batch.loss.learning_rate;
        let clip = batch.loss.grad_clip;
        let clip = (clip > 0.0).then_some(clip);
        let m = r
            .trainer
            .train_step(&seqs, lr, clip)
            .ctx("train_step_features")?;
        r.steps += 1;
        let mut out = vec![
            Metric::new("loss", m.loss),
            Metric::new("grad_norm", m.grad_norm),
            Metric::new("tokens", m.tokens as f64),
            Metric::new("recv_s", recv_s),
            Metric::new("feature_bytes", (rows * r.width * 4) as f64),
        ];
        for (k, a) in m.acc_per_step.iter().enumerate() {
            out.push(Metric::new(&format!("acc_{k}"), *a));
        }
        for (k, l) in m.loss_per_step.iter().enumerate() {
            out.push(Metric::new(&format!("loss_{k}"), *l));
        }
        Ok(out)
    }

    fn save_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        let version = self.version;
        let r = self.ready()?;
        let path = PathBuf::from(&dir);
        r.trainer
            .drafter
            .save(&path)
            .ctx(&format!("save_checkpoint {dir}"))?;
        Ok(CheckpointInfo {
            dir: dir.as_str().into(),
            weight_version: version,
            bytes: dir_bytes(&path),
        })
    }

    fn load_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        let version = self.version;
        let r = self.ready()?;
        let path = PathBuf::from(&dir);
        r.trainer
            .drafter
            .reload(&path)
            .ctx(&format!("load_checkpoint {dir}"))?;
        Ok(CheckpointInfo {
            dir: dir.as_str().into(),
            weight_version: version,
            bytes: dir_bytes(&path),
        })
    }

    fn export_weight_update(&mut self, kind: UpdateKind) -> Result<WeightUpdate> {
        if kind != UpdateKind::CheckpointDir {
            return Err(PluginError::not_supported(
                &format!("export_weight_update({})", kind.as_str()),
                COMPONENT,
            )
            .with_help("a drafter is exported as a directory: [bridge] mode = \"checkpoint\""));
        }
        let version = self.version + 1;
        let root = Path::new(self.config.run_dir.as_str()).join("drafter-sync");
        let dir = root.join(format!("v{version}"));
        self.ready()?
            .trainer
            .drafter
            .save(&dir)
            .ctx(&format!("exporting the drafter to {}", dir.display()))?;
        if version > KEEP_SYNCS {
            let _ = std::fs::remove_dir_all(root.join(format!("v{}", version - KEEP_SYNCS)));
        }
        self.version = version;
        Ok(WeightUpdate {
            version,
            payload: UpdatePayload::CheckpointDir {
                dir: dir.to_string_lossy().as_ref().into(),
            },
            digest: RString::new(),
        })
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
            host_call(self.host.pause_tags(rstrings(&fresh)), "offload")?;
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
            host_call(self.host.resume_tags(rstrings(&held)), "onload")?;
        }
        for t in &held {
            self.offloaded.remove(t);
        }
        Ok(())
    }

    fn stats(&self) -> Result<ComponentStats> {
        let mut metrics = Vec::new();
        let state = match &self.ready {
            None => "uninitialised".to_string(),
            Some(r) => {
                let d = &r.trainer.drafter;
                for (i, l) in d.aux_layers().iter().enumerate() {
                    metrics.push(Metric::new(&format!("{}{i}", stats::AUX_LAYER), *l as f64));
                }
                metrics.push(Metric::new(stats::FEATURE_WIDTH, r.width as f64));
                metrics.push(Metric::new(stats::MAX_ROWS, self.opts.max_tokens as f64));
                metrics.push(Metric::new("drafter.steps", r.steps as f64));
                for tag in [
                    BufferTag::Weights,
                    BufferTag::Grads,
                    BufferTag::Optimizer,
                    BufferTag::Activations,
                ] {
                    let bytes = r.provider.bytes(tag) as f64;
                    metrics.push(Metric::new(
                        &format!("allocated_bytes.{}", tag.as_str()),
                        bytes,
                    ));
                    // An offloaded tag's regions hold no physical memory.
                    let resident = if self.offloaded.contains(tag.as_str()) {
                        0.0
                    } else {
                        bytes
                    };
                    metrics.push(Metric::new(
                        &format!("resident_bytes.{}", tag.as_str()),
                        resident,
                    ));
                }
                if self.offloaded.is_empty() {
                    "ready".to_string()
                } else {
                    format!(
                        "offloaded: {}",
                        self.offloaded.iter().cloned().collect::<Vec<_>>().join(",")
                    )
                }
            }
        };
        Ok(ComponentStats {
            weight_version: self.version,
            state: state.into(),
            metrics: metrics.into(),
        })
    }
}

fn rstrings(tags: &[String]) -> RVec<RString> {
    tags.iter().map(|t| RString::from(t.as_str())).collect()
}

fn not_host(op: &str) -> PluginError {
    PluginError::new(
        tandem_plugin_api::ErrorCode::NotAvailable,
        format!("{op}: this trainer's buffers are heap vectors (no host memory services)"),
    )
    .with_help("run the trainer inside a `tandem worker` process, which attaches memory services")
}
