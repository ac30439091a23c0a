//! `tandem bench NAME`: every figure is printed beside its limit — the physical or peer figure
//! measured in the same run — as a table, or with `--json` as one JSON object per figure:
//! `{"bench", "case", "value", "unit", "limit", "ratio"}`.

pub mod abi;
pub mod bridges;
mod bridges_broadcast;
pub mod bridges_vllm;
pub mod command;
pub mod control;
pub mod memory;
pub mod native;
pub mod native_ref;
mod netns;
pub mod rl_loop;
mod rl_spec;
pub mod serve;
pub mod soak;
pub mod spec;
pub mod trainers;
pub mod transport;
pub mod transport_netns;

pub use tandem_bench_report::{Figure, table};
