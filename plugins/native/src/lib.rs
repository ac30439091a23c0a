//! The `native` plugin: a Llama-family CPU engine and trainer whose tensors live in
//! memory-layer regions.
//!
//! See `ARCH-NOTES.md` for the code map and invariants.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod acts;
pub mod backward;
pub mod bench;
pub mod buffer;
pub mod config;
pub mod digest;
pub mod engine;
pub mod error;
pub mod forward;
pub mod init;
pub mod layout;
pub mod linalg;
pub mod lora;
pub mod loss;
pub mod model;
pub mod ops;
pub mod optim;
pub mod par_io;
pub mod plugin;
pub mod sampling;
pub mod st_io;
pub mod tokenizer;
pub mod trainer;

pub use error::{NativeError, Result};

tandem_plugin_api::register_builtin!(plugin::NativePlugin);
