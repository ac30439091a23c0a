//! Environments (API level [`ENVIRONMENT`](crate::api_level::ENVIRONMENT)): what an
//! environment declares, the configuration it is built from, the items it yields and the
//! rewards it gives.
//!
//! The contract (checked by the conformance group `environment` of `tandem-conformance`):
//! - `item(split, index)` is a pure function of `(seed, split, index)`: the same item, id
//!   included, every time and in every process;
//! - ids are unique within a split, and no held-out item's prompt is a training item's;
//! - `score` answers one [`Reward`] per sample, in order, every `ok` value finite and inside
//!   the declared `[reward_min, reward_max]`; a sample the environment could not score is
//!   [`RewardStatus::Failed`] with a reason, never a silent 0.

use crate::types::Metric;
use abi_stable::StableAbi;
use abi_stable::std_types::{RString, RVec};
use serde::{Deserialize, Serialize};

/// Name of the training split.
pub const TRAIN_SPLIT: &str = "train";
/// Name of the held-out split (what `[eval]` and `tandem eval` score).
pub const HELD_OUT_SPLIT: &str = "held_out";

/// One environment component a plugin provides (listed by the root module's
/// `environments`).
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EnvironmentDecl {
    /// Name used in job files (`[environment] plugin = "<name>"`).
    pub name: RString,
    /// One-line description.
    pub description: RString,
}

/// Configuration handed to an environment's constructor.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EnvironmentConfig {
    /// Component name (the job file's `[environment] plugin`).
    pub component: RString,
    /// The `[environment.options]` table, as JSON.
    pub options_json: RString,
    /// The run's seed: items are a function of `(seed, split, index)`.
    pub seed: u64,
    /// Held-out items the run evaluates on (`[eval] problems`; 0: the run does not evaluate).
    /// An environment whose held-out split is generated sizes it so; one with a held-out file
    /// may ignore it.
    pub held_out: u32,
    /// Directory relative paths in the options resolve against (the job file's).
    pub base_dir: RString,
    /// The run directory (scratch files, worker logs); empty when the environment is only
    /// checked (`tandem check`): then start no process and open no server.
    pub run_dir: RString,
}

impl EnvironmentConfig {
    /// Whether the environment is only being checked (nothing may be started).
    pub fn check_only(&self) -> bool {
        self.run_dir.is_empty()
    }
}

/// One split of an environment.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SplitInfo {
    /// [`TRAIN_SPLIT`], [`HELD_OUT_SPLIT`] or another name.
    pub name: RString,
    /// Items in one pass (an epoch) of the split; 0 for an endless (generated) split.
    pub size: u64,
}

/// What an environment says about itself once built.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EnvironmentInfo {
    /// Its splits; `train` is always one.
    pub splits: RVec<SplitInfo>,
    /// Names of the reward components every `ok` reward reports (may be empty).
    pub components: RVec<RString>,
    /// Data sources items come from (`Item::source`), for per-source metrics; may be empty.
    pub sources: RVec<RString>,
    /// Smallest `ok` reward value.
    pub reward_min: f32,
    /// Largest `ok` reward value.
    pub reward_max: f32,
    /// The environment answers over several turns (a later API level drives it); this level
    /// drives single-turn environments only.
    pub multi_turn: bool,
}

/// One chat message of a prompt.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: RString,
    /// The message text.
    pub content: RString,
}

/// One problem of an environment.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EnvItem {
    /// Unique within its split, stable across runs (a dataset row's id, `split:index`).
    pub id: RString,
    /// The prompt as text; empty when `messages` holds it.
    pub prompt: RString,
    /// The prompt as chat messages (rendered with the model's chat template); empty when
    /// `prompt` holds it.
    pub messages: RVec<ChatMessage>,
    /// The reference answer when there is one (warm starts train on it); may be empty.
    pub answer: RString,
    /// Data source (per-source metrics and reward routing); may be empty.
    pub source: RString,
    /// Anything else the reward needs, as a JSON object (`{}` when nothing).
    pub metadata_json: RString,
}

/// A completion to score: its text and the token ids the engine produced.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CompletionText {
    /// The decoded text (special tokens skipped).
    pub text: RString,
    /// The token ids the engine sampled.
    pub token_ids: RVec<u32>,
    /// Generation stopped at a stop token (not at the token limit).
    pub finished: bool,
}

/// An item and one completion of it.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ScoreSample {
    /// The item the completion answers.
    pub item: EnvItem,
    /// The completion.
    pub completion: CompletionText,
}

/// Whether a reward was computed.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RewardStatus {
    /// `value` is the reward.
    Ok,
    /// The sample could not be scored (a raise, a timeout, a dead worker, a NaN, a value out
    /// of range); `reason` says why. The host counts it and trains nothing on it.
    Failed,
    /// No reward applies to this sample (e.g. a data source without a verifier); it is
    /// counted and not trained on.
    NotApplicable,
}

/// The reward of one sample.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Reward {
    /// The reward (meaningful when `status` is `Ok`).
    pub value: f32,
    /// Its components, by name (the weighted sum of which is `value`).
    pub components: RVec<Metric>,
    /// Whether it was computed.
    pub status: RewardStatus,
    /// Why not, when `status` is not `Ok`; one line.
    pub reason: RString,
}

impl Reward {
    /// An `ok` reward with no components.
    pub fn ok(value: f32) -> Reward {
        Reward {
            value,
            components: RVec::new(),
            status: RewardStatus::Ok,
            reason: RString::new(),
        }
    }

    /// A failed sample.
    pub fn failed(reason: impl Into<String>) -> Reward {
        Reward {
            value: 0.0,
            components: RVec::new(),
            status: RewardStatus::Failed,
            reason: RString::from(reason.into()),
        }
    }

    /// A sample no reward applies to.
    pub fn not_applicable(reason: impl Into<String>) -> Reward {
        Reward {
            status: RewardStatus::NotApplicable,
            ..Reward::failed(reason)
        }
    }

    /// Adds a component.
    #[must_use]
    pub fn with_component(mut self, name: &str, value: f64) -> Reward {
        self.components.push(Metric::new(name, value));
        self
    }
}

impl EnvItem {
    /// A text-prompt item with no metadata.
    pub fn text(
        id: impl Into<String>,
        prompt: impl Into<String>,
        answer: impl Into<String>,
    ) -> EnvItem {
        EnvItem {
            id: RString::from(id.into()),
            prompt: RString::from(prompt.into()),
            messages: RVec::new(),
            answer: RString::from(answer.into()),
            source: RString::new(),
            metadata_json: RString::from("{}"),
        }
    }
}
