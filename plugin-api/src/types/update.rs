//! Weight updates: what a trainer exports and an engine applies (shared region, adapter,
//! checkpoint dir, tensor buckets), with version and digest.

use abi_stable::StableAbi;
use abi_stable::std_types::{RString, RVec};
use serde::{Deserialize, Serialize};

use super::memory::DType;

/// Kinds of weight update a trainer can export and an engine can apply.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpdateKind {
    /// Weights in a shared memory region the engine maps (single copy).
    SharedRegion,
    /// A PEFT LoRA adapter.
    Adapter,
    /// A Hugging Face checkpoint directory.
    CheckpointDir,
    /// Bucketed tensors sent over the transport.
    TensorBuckets,
}

impl UpdateKind {
    /// Lower-case name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateKind::SharedRegion => "shared_region",
            UpdateKind::Adapter => "adapter",
            UpdateKind::CheckpointDir => "checkpoint_dir",
            UpdateKind::TensorBuckets => "tensor_buckets",
        }
    }
}

/// Placement of one tensor inside a region or bucket.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Hugging Face parameter name.
    pub name: RString,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: RVec<u64>,
    /// Byte offset from the start of the region or bucket.
    pub offset: u64,
}

/// Reference to a shareable memory region owned by another process.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SharedRegionRef {
    /// Host-assigned key of the region (resolved through host services).
    pub key: RString,
    /// Device the region lives on (`cpu`, `cuda:0`).
    pub device: RString,
    /// Length in bytes.
    pub len: u64,
}

/// A group of tensors sent together over the transport.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TensorBucket {
    /// Tensors, with offsets relative to the bucket.
    pub tensors: RVec<TensorSpec>,
    /// Total bucket size in bytes.
    pub bytes: u64,
}

/// Where the new weights of an update are.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum UpdatePayload {
    /// Single copy: the engine maps this region and reads the tensors in place.
    SharedRegion {
        /// The region.
        region: SharedRegionRef,
        /// Tensor layout inside it. May be empty in a later update of a region whose layout
        /// an earlier update carried (it cannot change); the host then adds it back for an
        /// engine that has not attached the region.
        tensors: RVec<TensorSpec>,
    },
    /// A PEFT adapter directory to load under `name`.
    Adapter {
        /// Versioned adapter name to load it under.
        name: RString,
        /// Directory holding `adapter_config.json` + `adapter_model.safetensors`.
        dir: RString,
    },
    /// A complete Hugging Face checkpoint directory.
    CheckpointDir {
        /// The directory.
        dir: RString,
    },
    /// Tensors arriving over the transport on a named group.
    TensorBuckets {
        /// Transport group the buckets arrive on.
        group: RString,
        /// The buckets, in send order.
        buckets: RVec<TensorBucket>,
    },
}

impl UpdatePayload {
    /// The kind of this payload.
    pub fn kind(&self) -> UpdateKind {
        match self {
            UpdatePayload::SharedRegion { .. } => UpdateKind::SharedRegion,
            UpdatePayload::Adapter { .. } => UpdateKind::Adapter,
            UpdatePayload::CheckpointDir { .. } => UpdateKind::CheckpointDir,
            UpdatePayload::TensorBuckets { .. } => UpdateKind::TensorBuckets,
        }
    }
}

/// A weight update: the new weights' location plus version and digest.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WeightUpdate {
    /// Weight version; only ever goes up.
    pub version: u64,
    /// Where the weights are.
    pub payload: UpdatePayload,
    /// Hex digest of the weights as the producer sees them (empty: not computed).
    pub digest: RString,
}

/// What an engine reports after applying an update.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct UpdateReport {
    /// Version now served.
    pub version: u64,
    /// Hex digest of the weights the engine now serves (empty: not computed).
    pub digest: RString,
    /// Bytes the engine copied to apply the update.
    pub bytes_copied: u64,
}
