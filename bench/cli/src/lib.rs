//! `tandem-bench`: every `tandem bench NAME`, outside the product crates. Every figure is
//! printed beside its limit — the physical or peer figure measured in the same run — as a
//! table, or with `--json` as one JSON object per figure:
//! `{"bench", "case", "value", "unit", "limit", "ratio"}`.
//!
//! The `tandem-bench` binary links the built-in plugins as `tandem` does and runs
//! [`command::main`]; `tandem bench ARGS` runs it with `ARGS` (found beside `tandem`, else on
//! `PATH`). Workers the benches start are the `tandem` binary's ([`exe`]); the transport
//! bench's rank processes are `tandem-bench` itself ([`transport::child_main_if_requested`]).

#![forbid(unsafe_code)]

pub mod abi;
pub mod bridges;
mod bridges_broadcast;
pub mod bridges_vllm;
pub mod command;
pub mod control;
pub mod envs;
pub mod exe;
pub mod memory;
pub mod native;
pub mod native_ref;
mod netns;
pub mod rl_async;
pub mod rl_loop;
mod rl_spec;
pub mod serve;
pub mod soak;
pub mod spec;
pub mod trainers;
pub mod transport;
pub mod transport_netns;

pub use tandem_bench_report::{Figure, table};
