//! `tandem-native-core`'s integration tests, one module per area. `hf_parity` is ignored
//! (needs `TANDEM_REF_PYTHON`): `cargo test -p tandem-native-core --test it -- --ignored hf_parity::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

mod drafter;
mod drafter_grad;
mod drafter_runner;
mod end_to_end;
mod engine;
mod gradcheck_model;
mod gradcheck_value;
mod hf_parity;
mod io;
mod micro_batch;
mod spec;
mod spec_dist;
mod train;
