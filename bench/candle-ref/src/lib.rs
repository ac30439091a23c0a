//! candle 0.11 running the same Hugging Face Llama / Qwen2 directory (config.json +
//! model.safetensors) as the native backend, for `tandem bench native`:
//!
//! - [`InferModel`]: candle-transformers' own `llama::Llama` / `qwen2::ModelForCausalLM` (fused
//!   CPU ops, `Tensor::cat` KV cache) — last-position logits and greedy batched decode.
//! - [`TrainModel`]: the same architecture written with candle's differentiable ops
//!   (`rms_norm_slow`, `rope_slow`, `ops::softmax`; the fused ones have no backward in 0.11),
//!   trained with candle's autograd and `candle_nn::AdamW` — all-position logits and one
//!   full fine-tuning SFT step (cross-entropy, global-norm clip, AdamW).
//!
//! This crate is outside the workspace so that a plain `cargo build --workspace` never
//! compiles candle.

#![forbid(unsafe_code)]

mod config;
mod infer;
mod train;

pub use config::RefConfig;
pub use infer::{Decoded, InferModel};
pub use train::{StepReport, TrainModel};

/// Errors of the candle reference.
#[derive(Debug, thiserror::Error)]
pub enum RefError {
    /// candle failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// Reading the model directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The config is not one the reference can run.
    #[error("{0}")]
    Config(String),
}

/// Result with [`RefError`].
pub type Result<T> = std::result::Result<T, RefError>;
