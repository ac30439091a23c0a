//! The `native` plugin: a Llama-family CPU engine and trainer whose tensors live in
//! memory-layer regions.
//!
//! See `ARCH-NOTES.md` for the code map and invariants.

pub mod buffer;
pub mod config;
pub mod error;
pub mod layout;
pub mod linalg;
pub mod ops;

pub use error::{NativeError, Result};
