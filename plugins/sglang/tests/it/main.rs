//! `tandem-plugin-sglang`'s integration tests, one module per area: the plugin contract
//! (`conformance`) and SGLang's request definitions (`contract`, ignored: needs the sglang
//! wheel) against a `tandem serve`, launch-mode supervision (`launch`) and a scripted SGLang
//! server (`mock_server`). Needs the workspace built (`cargo build --workspace`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod support;

mod conformance;
mod contract;
mod launch;
mod mock_server;
