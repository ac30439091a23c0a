//! The subset of a Hugging Face `config.json` both reference models need.

use std::path::Path;

use serde_json::Value;

use crate::{RefError, Result};

/// Architecture of the model directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `model_type: llama`.
    Llama,
    /// `model_type: qwen2` (q/k/v biases).
    Qwen2,
}

/// Model hyper-parameters read from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct RefConfig {
    /// Layout family.
    pub arch: Arch,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// SwiGLU width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA).
    pub num_key_value_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// RMSNorm ε.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE table length.
    pub max_position_embeddings: usize,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections have biases (Qwen2, or Llama `attention_bias`).
    pub qkv_bias: bool,
    /// o projection has a bias (Llama `attention_bias`).
    pub o_bias: bool,
}

fn get_usize(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| RefError::Config(format!("config.json: `{key}` missing or not an integer")))
}

impl RefConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| RefError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| RefError::Config(format!("{}: {e}", path.display())))?;
        let arch = match v.get("model_type").and_then(Value::as_str) {
            Some("llama") => Arch::Llama,
            Some("qwen2") => Arch::Qwen2,
            other => {
                return Err(RefError::Config(format!(
                    "{}: model_type {other:?} is not llama or qwen2",
                    path.display()
                )));
            }
        };
        let heads = get_usize(&v, "num_attention_heads")?;
        let hidden = get_usize(&v, "hidden_size")?;
        let bias = v
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let rope_theta = v
            .get("rope_theta")
            .or_else(|| v.get("rope_parameters").and_then(|r| r.get("rope_theta")))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        Ok(RefConfig {
            arch,
            vocab_size: get_usize(&v, "vocab_size")?,
            hidden_size: hidden,
            intermediate_size: get_usize(&v, "intermediate_size")?,
            num_hidden_layers: get_usize(&v, "num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: get_usize(&v, "num_key_value_heads").unwrap_or(heads),
            head_dim: get_usize(&v, "head_dim").unwrap_or(hidden / heads.max(1)),
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            max_position_embeddings: get_usize(&v, "max_position_embeddings")?,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || bias,
            o_bias: arch == Arch::Llama && bias,
        })
    }
}
