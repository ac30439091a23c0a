//! Weight bridges as components (API level 4): what a bridge tells the host it needs at run
//! time ([`BridgePlan`]) and the transport group its halves share ([`BRIDGE_GROUP`]).
//!
//! A bridge is chosen by a job's `[bridge] plugin = "<component>"`. Its static needs are its
//! declared [`Capabilities::update_kinds`](crate::Capabilities): the first kind is what the
//! trainer must export, the last what every engine's `apply_weight_update` must accept (one
//! kind: both). What depends on its options is the plan, asked once before the run starts.

use abi_stable::StableAbi;
use abi_stable::std_types::{RString, RVec};
use serde::{Deserialize, Serialize};

/// Name of the transport group a bridge's halves share when its plan asks for one: group
/// rank 0 is trainer rank 0 (the root of a broadcast), group rank `1 + i` is engine rank `i`.
pub const BRIDGE_GROUP: &str = "bridge";

/// What a bridge needs from the host, given its options.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct BridgePlan {
    /// Memory tags neither the trainer nor the engines may offload or release while the
    /// bridge is in use (e.g. `weights` when engines serve the trainer's memory in place).
    pub resident_tags: RVec<RString>,
    /// Engines are restarted on each shipped checkpoint directory (a new process started on
    /// it, health-checked, then swapped in) instead of applying it in place; only the host
    /// owns processes, so it does the restart.
    pub restart_engines: bool,
    /// The halves move data over the transport group [`BRIDGE_GROUP`]: the host builds it
    /// and runs the trainer half's `send` while every engine applies the update.
    pub transport: bool,
    /// The host syncs once after the trainer's init, before the first rollout (e.g. engines
    /// start serving the trainer's own memory and free their copy).
    pub sync_at_start: bool,
}
