//! Memory: the well-known tags, element types, and the tagged regions a plugin asks the host
//! for.

use abi_stable::StableAbi;
use abi_stable::std_types::RString;
use serde::{Deserialize, Serialize};

/// Well-known memory tags. Custom tags are any other non-empty string.
pub mod tags {
    /// Model parameters.
    pub const WEIGHTS: &str = "weights";
    /// Attention key/value cache of an engine.
    pub const KV_CACHE: &str = "kv_cache";
    /// Optimizer state (e.g. AdamW moments).
    pub const OPTIMIZER: &str = "optimizer";
    /// Gradients.
    pub const GRADS: &str = "grads";
    /// Activations kept for the backward pass.
    pub const ACTIVATIONS: &str = "activations";
    /// Speculative-decoding drafter weights and state.
    pub const DRAFTER: &str = "drafter";
    /// All well-known tags, in the order the host reports them.
    pub const ALL: [&str; 6] = [WEIGHTS, KV_CACHE, OPTIMIZER, GRADS, ACTIVATIONS, DRAFTER];
}

/// Element type of a tensor or region.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit brain float.
    BF16,
    /// 16-bit IEEE float.
    F16,
    /// Unsigned bytes (opaque data).
    U8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }
}

/// Request for a tagged memory region from the host.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct RegionRequest {
    /// Memory tag (see [`tags`]).
    pub tag: RString,
    /// Region name, unique within the process (for logs and sharing).
    pub name: RString,
    /// Size in bytes.
    pub bytes: u64,
    /// Element type of the contents.
    pub dtype: DType,
    /// Keep a CPU copy across a pause (`true`), or come back zeroed (`false`).
    pub backup: bool,
}

/// A region granted by the host: the plugin may compute on `[addr, addr + len)` while it is
/// resident. The address stays valid across pause/resume.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct RegionInfo {
    /// Host-assigned id.
    pub id: u64,
    /// Key under which the region can be shared with another process.
    pub key: RString,
    /// Start address in this process.
    pub addr: usize,
    /// Length in bytes.
    pub len: u64,
}
