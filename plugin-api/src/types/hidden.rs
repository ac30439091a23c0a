//! Hidden states (API level 3): an engine's per-position features of given layers, moved to a
//! trainer over the data plane (a transport group) or, for comparison and small payloads,
//! through the control plane; and the batch a drafter trainer steps on.
//!
//! Features of one sequence are `[len, layers · hidden]` f32 rows, row `t` the residual
//! stream entering each requested layer at position `t` (layer id = the number of layers
//! means the final residual, before the final norm). A batch's features are the sequences'
//! rows concatenated in batch order; on the wire they are the rows' little-endian bytes.
//!
//! A trainer that declares `hidden_states` says in its stats which features it steps on:
//! [`stats::AUX_LAYER`]`<i>` (the layer ids, in row order) and [`stats::FEATURE_WIDTH`].

use abi_stable::StableAbi;
use abi_stable::std_types::{ROption, RString, RVec};
use serde::{Deserialize, Serialize};

/// Where features travel.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum FeatureRoute {
    /// Through the control plane: in the report (engine) or the batch (trainer).
    Inline,
    /// Over the transport: one message of `rows · width · 4` bytes on `group`, to / from
    /// group rank `peer`, with `tag`.
    Transport {
        /// Transport group (e.g. `pair0`).
        group: RString,
        /// The other side's rank in the group.
        peer: u32,
        /// Message tag (the step, so a late message can never be taken for the next).
        tag: u64,
    },
}

/// What `InferenceEngine::hidden_states` computes and where it sends it.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HiddenStatesRequest {
    /// Token ids of each sequence (prompt + completion).
    #[serde(with = "crate::wire::packed::nested")]
    pub sequences: RVec<RVec<u32>>,
    /// Layer ids whose input residual streams make a row, in row order.
    pub layers: RVec<u32>,
    /// LoRA adapter to run with; `None` uses the base weights.
    pub adapter: ROption<RString>,
    /// Where the features go.
    pub route: FeatureRoute,
}

/// What an engine reports after `hidden_states`.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HiddenStatesReport {
    /// Rows produced (Σ sequence lengths).
    pub rows: u64,
    /// f32 values per row (`layers · hidden`).
    pub width: u32,
    /// Bytes sent over the transport (0 for `Inline`).
    pub bytes_sent: u64,
    /// The features, `[rows, width]`, for `Inline`; empty otherwise.
    #[serde(with = "crate::wire::packed")]
    pub features: RVec<f32>,
}

/// One message of features a trainer receives for a step.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FeatureSource {
    /// Where the features come from (`Transport`: the engine's rank in the group).
    pub route: FeatureRoute,
    /// Rows in this message.
    pub rows: u64,
    /// The rows for `Inline`; empty otherwise.
    #[serde(with = "crate::wire::packed")]
    pub features: RVec<f32>,
}

/// The features of a `train_step_features` batch: the sources' rows, concatenated in order,
/// are the batch's sequences' rows in batch order.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FeatureBatch {
    /// f32 values per row.
    pub width: u32,
    /// Layer ids the rows were taken from (the trainer checks them against its model).
    pub layers: RVec<u32>,
    /// The messages, in batch order.
    pub sources: RVec<FeatureSource>,
}

impl FeatureBatch {
    /// Total rows over every source.
    pub fn rows(&self) -> u64 {
        self.sources.iter().map(|s| s.rows).sum()
    }
}

/// Stats names of a trainer that steps on hidden states (`train_step_features`).
pub mod stats {
    /// Prefix of the layer ids its features are taken from: `drafter.aux_layer.0`, `.1`, ...
    pub const AUX_LAYER: &str = "drafter.aux_layer.";
    /// f32 values per feature row.
    pub const FEATURE_WIDTH: &str = "drafter.feature_width";
    /// Most feature rows one `train_step_features` call may carry.
    pub const MAX_ROWS: &str = "drafter.max_rows";
}
