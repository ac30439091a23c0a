//! The `tandem` binary's tests that run in every `cargo test`: one binary, one module per
//! area, tests named `it::AREA::TEST` (`cargo test -p tandem --test it -- AREA::`). Tests run
//! in parallel threads of this one process: a test that measures this process's shared memory
//! or counts its own children takes `common::process_lock()`. Needs `cargo build --workspace`
//! first (the fixture plugins and plugin libraries), as `scripts/test.sh` does.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

#[path = "../common/mod.rs"]
mod common;
/// The cluster tests' job files (`cluster_launchers` builds one without a cluster).
#[path = "../cluster/hosts.rs"]
mod hosts;

mod abi_versions;
mod bench_output;
mod bridges;
mod chat_template;
mod check;
mod check_run;
mod checkpoints;
mod cluster_launchers;
mod discovery;
mod drafter_job;
mod environments;
mod eval;
mod loader;
mod memory_services;
mod model_digest;
mod model_files;
mod native_cli;
mod out_of_tree;
mod out_of_tree_bridge;
mod out_of_tree_env;
mod out_of_tree_squeeze;
mod placement_cpus;
mod recovery;
mod rl_async;
mod rl_learns;
mod rl_loop;
mod rl_ppo;
mod rl_tools;
mod rl_variants;
mod serve;
mod sglang_loop;
mod tracking;
mod transport_services;
mod workers;
