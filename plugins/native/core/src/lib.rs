//! Compute core of the `native` backend: a Llama/Qwen2 decoder (forward, hand-written
//! backward, AdamW, LoRA in PEFT format, KV-cache generation) whose every tensor lives in a flat
//! f32 buffer handed out by a [`buffer::BufferProvider`], plus the Hugging Face directory I/O,
//! the tokenizer, the init presets and the weight digest around it.
//!
//! Knows nothing of the plugin ABI: `tandem-plugin-native` wraps [`engine::Engine`] and
//! [`trainer::Trainer`] as components. See `NOTES.md` for the code map and invariants.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod acts;
pub mod backward;
pub mod buffer;
pub mod config;
pub mod digest;
pub mod drafter;
pub mod engine;
pub mod error;
pub mod forward;
pub mod head;
pub mod init;
pub mod layout;
pub mod linalg;
pub mod lora;
pub mod loss;
pub mod model;
pub mod ops;
pub mod optim;
pub mod par_io;
pub mod sampling;
pub mod st_io;
pub mod tokenizer;
pub mod trainer;
pub mod value;
pub mod value_head;

pub use error::{NativeError, Result};
