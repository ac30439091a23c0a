//! `tandem-memory`'s integration tests, one module per area (`cuda_vmm` with the `cuda`
//! feature only). Tests that allocate or measure much memory take `common::big_memory_lock()`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

#[cfg(feature = "cuda")]
mod cuda_vmm;
mod pause_resume;
mod policy;
mod processes;
