//! `tandem-model`: model directories in the Hugging Face layout — importing a GGUF file
//! (`tandem model import`), keeping every directory Tandem writes complete (tokenizer,
//! generation config, chat template of the model it came from), and merging a PEFT LoRA
//! adapter into its base (`tandem model merge-lora`) — and its text side: the chat template
//! rendered as Hugging Face renders it ([`chat`]) and its special token ids ([`tokens`]).
//!
//! Pure file work: no plugin, no compute core. Every writer builds its output in a sibling
//! temporary directory and renames it into place, so a failure leaves nothing at the target.

#![forbid(unsafe_code)]

pub mod chat;
pub mod companion;
pub mod error;
pub mod fetch;
pub mod gguf;
pub mod merge;
pub mod tokens;
pub mod tools;
pub mod write;

pub use error::ModelError;
