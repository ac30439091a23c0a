//! The run's environment: the component named by `[environment] plugin`, built in the
//! controller through the registry, asked for the problems at the data position and for
//! one batched score per rollout. The host holds the environment to its contract
//! (`tandem_plugin_api::types::env`): a reply of the wrong length, a NaN or a value outside
//! the declared range is turned into failed samples here, whatever the plugin does, so a
//! failure is always counted and never trained on as a 0 ([`score`]).
//!
//! The engine sees token ids only: the controller renders prompts (text, or chat messages
//! through the model's chat template) and decodes completions with the model's tokenizer.

pub mod score;

pub use score::{ScoreTally, Scored, ToScore};

use crate::config::EnvironmentSection;
use crate::error::RlError;
use std::path::Path;
use tandem_plugin_api::{
    EnvItem, EnvironmentBox, EnvironmentConfig, EnvironmentInfo, HELD_OUT_SPLIT, RString,
    TRAIN_SPLIT,
};
use tandem_runtime::registry::Registry;

/// One problem: an environment's item at a position of a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Position of the problem in its split (the data position for `train`).
    pub index: u64,
    /// The item as the environment gave it.
    pub item: EnvItem,
}

impl Problem {
    /// The item's id.
    pub fn id(&self) -> &str {
        self.item.id.as_str()
    }

    /// The prompt text (empty when the prompt is chat messages).
    pub fn prompt(&self) -> &str {
        self.item.prompt.as_str()
    }

    /// The reference answer (may be empty).
    pub fn answer(&self) -> &str {
        self.item.answer.as_str()
    }

    /// The supervised target text for warm starts: a space, then the answer.
    pub fn target(&self) -> String {
        format!(" {}", self.item.answer)
    }
}

/// What builds an environment: its section, the run's seed and held-out size, and where
/// relative paths resolve.
#[derive(Debug, Clone, Copy)]
pub struct EnvSpec<'a> {
    /// `[environment]`.
    pub section: &'a EnvironmentSection,
    /// The run's seed.
    pub seed: u64,
    /// Held-out problems the run evaluates on (0: none).
    pub held_out: u32,
    /// The job file's directory.
    pub base_dir: &'a Path,
}

/// A built environment.
pub struct Env {
    name: String,
    inner: EnvironmentBox,
    info: EnvironmentInfo,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("name", &self.name)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Env {
    /// Builds the environment of `spec`; with `run_dir` `None` it is only checked (it starts
    /// nothing: `tandem check`).
    pub fn build(
        registry: &Registry,
        spec: EnvSpec<'_>,
        run_dir: Option<&Path>,
    ) -> Result<Env, RlError> {
        let name = spec.section.plugin.clone();
        let options = serde_json::Value::Object(spec.section.options.clone());
        let config = EnvironmentConfig {
            component: name.as_str().into(),
            options_json: options.to_string().into(),
            seed: spec.seed,
            held_out: spec.held_out,
            base_dir: spec.base_dir.display().to_string().into(),
            run_dir: run_dir
                .map(|d| RString::from(d.display().to_string()))
                .unwrap_or_default(),
        };
        let services = tandem_runtime::services::Services::new();
        let inner = registry.new_environment(config, services.handle())?;
        let info = inner
            .describe()
            .into_result()
            .map_err(|e| RlError::plugin(format!("environment `{name}`: describe"), e))?;
        if !info.splits.iter().any(|s| s.name == TRAIN_SPLIT) {
            return Err(RlError::failed(format!(
                "environment `{name}` has no `{TRAIN_SPLIT}` split"
            )));
        }
        if !(info.reward_min.is_finite()
            && info.reward_max.is_finite()
            && info.reward_min < info.reward_max)
        {
            return Err(RlError::failed(format!(
                "environment `{name}` declares the reward range [{}, {}]",
                info.reward_min, info.reward_max
            )));
        }
        Ok(Env { name, inner, info })
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it said about itself.
    pub fn info(&self) -> &EnvironmentInfo {
        &self.info
    }

    /// Items in one pass of `split` (0: endless; `None`: no such split).
    pub fn split_size(&self, split: &str) -> Option<u64> {
        self.info
            .splits
            .iter()
            .find(|s| s.name == split)
            .map(|s| s.size)
    }

    /// Problem `index` of `split`.
    pub fn item(&self, split: &str, index: u64) -> Result<Problem, RlError> {
        let item = self
            .inner
            .item(split.into(), index)
            .into_result()
            .map_err(|e| {
                RlError::plugin(
                    format!("environment `{}`: item {index} of `{split}`", self.name),
                    e,
                )
            })?;
        Ok(Problem { index, item })
    }

    /// Training problem `index` (the data position).
    pub fn problem(&self, index: u64) -> Result<Problem, RlError> {
        self.item(TRAIN_SPLIT, index)
    }

    /// The first `count` problems of the held-out split (fewer when it is smaller).
    pub fn held_out(&self, count: u32) -> Result<Vec<Problem>, RlError> {
        let size = self.split_size(HELD_OUT_SPLIT).ok_or_else(|| {
            RlError::usage(format!(
                "environment `{}` has no `{HELD_OUT_SPLIT}` split to evaluate on",
                self.name
            ))
            .with_help("remove [eval], or give the environment a held-out split")
        })?;
        let n = if size == 0 {
            u64::from(count)
        } else {
            size.min(u64::from(count))
        };
        (0..n).map(|i| self.item(HELD_OUT_SPLIT, i)).collect()
    }
}
