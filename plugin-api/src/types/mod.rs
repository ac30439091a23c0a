//! FFI-safe data types carried by the role traits, one file per concern:
//! - `generate`: sampling parameters, generate requests and completions, pause modes, health;
//! - `train`: train batches and sequences, loss settings, trainer and checkpoint info;
//! - `update`: weight updates (`UpdatePayload` kinds, tensor layouts) and their reports;
//! - `memory`: well-known [`tags`], [`DType`], region requests and grants;
//! - `component`: component config, [`ConfigProblem`], metrics and stats, log levels;
//! - `hidden`: hidden-state requests, routes (control plane or transport) and feature batches
//!   (API level 3);
//! - `bridge`: what a bridge component needs at run time and its transport group (API level
//!   4);
//! - `shipment`: what a bridge's halves hand each other (API level 7): shipments, what an
//!   engine half returns, resident tags per side, apply outcomes;
//! - `env`: environments' declarations, items, completions and rewards (API level 6).
//!
//! Everything is re-exported here and at the crate root. Everything is `#[repr(C)]` (structs)
//! or `#[repr(u8)]` (enums) and derives `StableAbi`, so abi_stable checks its layout when a
//! plugin is loaded. The types the host sends between its processes (requests, completions,
//! batches, updates, reports, stats, errors) also derive serde's `Serialize`/`Deserialize`
//! (token ids and logprobs as blobs, [`crate::wire`]); a derive adds no field, so the layouts
//! are the same.

mod bridge;
mod component;
mod env;
mod generate;
mod hidden;
mod memory;
mod shipment;
mod train;
mod update;

pub use bridge::*;
pub use component::*;
pub use env::*;
pub use generate::*;
pub use hidden::*;
pub use memory::*;
pub use shipment::*;
pub use train::*;
pub use update::*;
