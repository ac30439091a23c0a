//! The `tandem` binary's tests against real Python engines and trainers: vLLM (the engine
//! plugin, the RL loop, EAGLE-3 drafters), torch FSDP2 and Megatron-Core trainers, the
//! SmolLM2 model against transformers, and the `openai` client against `tandem serve`. Every
//! test that needs Python is `#[ignore]`d (its reason names what it needs) and fails at once
//! without `TANDEM_PYTHON` / `TANDEM_REF_PYTHON`; the few that check a missing Python run in
//! every `cargo test`. Run one area at a time, one test thread (at most one vLLM server or
//! torchrun group at a time):
//!
//! ```text
//! export TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1)
//! cargo build --workspace
//! cargo test -p tandem --test real -- --ignored --test-threads=1 vllm_engine::
//! ```
//!
//! Areas: `vllm_engine`, `vllm_loop`, `vllm_eagle3`, `fsdp_trainer`, `megatron_trainer`,
//! `smollm2` (`TANDEM_REF_PYTHON`), `serve_openai_client`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

#[path = "../common/mod.rs"]
mod common;
mod torchrun_fixture;

mod fsdp_trainer;
mod megatron_trainer;
mod serve_openai_client;
mod smollm2;
mod vllm_eagle3;
mod vllm_engine;
mod vllm_loop;
