//! Model configuration read from (and written to) a Hugging Face `config.json`
//! (Llama and Qwen2 layouts).

use std::path::Path;

use serde_json::{Value, json};

use crate::error::{NativeError, Result};

/// Which Hugging Face architecture family the checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `LlamaForCausalLM` (also SmolLM, Mistral-like layouts without sliding window).
    Llama,
    /// `Qwen2ForCausalLM`: q/k/v projections carry biases.
    Qwen2,
}

/// Architecture hyper-parameters of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture family.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding and lm_head).
    pub vocab_size: usize,
    /// Model width `d`.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA); divides `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Per-head width (defaults to hidden_size / num_attention_heads).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Maximum sequence length.
    pub max_position_embeddings: usize,
    /// lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections have biases (Qwen2 always; Llama when `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj has a bias (Llama with `attention_bias`).
    pub o_bias: bool,
    /// Beginning-of-sequence token id, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token ids (may be several).
    pub eos_token_ids: Vec<u32>,
}

fn get_usize(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| NativeError::Config(format!("config.json: missing or non-integer `{key}`")))
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// Parses the JSON value of a `config.json`.
    pub fn from_json(v: &Value) -> Result<Self> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let arch = if model_type == "qwen2" || archs.contains(&"Qwen2ForCausalLM") {
            Arch::Qwen2
        } else if model_type == "llama" || archs.contains(&"LlamaForCausalLM") {
            Arch::Llama
        } else {
            return Err(NativeError::Config(format!(
                "model_type `{model_type}` / architectures {archs:?} not supported; the native \
                 backend runs `llama` and `qwen2` checkpoints"
            )));
        };
        let hidden_size = get_usize(v, "hidden_size")?;
        let num_attention_heads = get_usize(v, "num_attention_heads")?;
        let num_key_value_heads = v
            .get("num_key_value_heads")
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .unwrap_or(num_attention_heads);
        let head_dim = v
            .get("head_dim")
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .unwrap_or(hidden_size / num_attention_heads.max(1));
        let rope_params = v.get("rope_parameters");
        let rope_theta = v
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| {
                rope_params
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10000.0);
        let scaling = v.get("rope_scaling").filter(|s| !s.is_null()).or_else(|| {
            rope_params.filter(|p| p.get("rope_type").and_then(Value::as_str) != Some("default"))
        });
        if let Some(s) = scaling {
            return Err(NativeError::Config(format!(
                "rope scaling {s} is not supported yet; use a checkpoint with default RoPE"
            )));
        }
        if v.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            return Err(NativeError::Config(
                "mlp_bias = true is not supported".into(),
            ));
        }
        let hidden_act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if hidden_act != "silu" {
            return Err(NativeError::Config(format!(
                "hidden_act `{hidden_act}` not supported (only silu)"
            )));
        }
        let attention_bias = v
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let cfg = ModelConfig {
            arch,
            vocab_size: get_usize(v, "vocab_size")?,
            hidden_size,
            intermediate_size: get_usize(v, "intermediate_size")?,
            num_hidden_layers: get_usize(v, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            max_position_embeddings: v
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .unwrap_or(2048),
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || attention_bias,
            o_bias: arch == Arch::Llama && attention_bias,
            bos_token_id: ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: ids(v.get("eos_token_id")),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| NativeError::io(&path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| NativeError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::from_json(&v)
    }

    /// Checks internal consistency (head counts divide, even head_dim, non-zero sizes).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(NativeError::Config(m));
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_hidden_layers == 0 {
            return bad("vocab_size, hidden_size and num_hidden_layers must be > 0".into());
        }
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even and > 0", self.head_dim));
        }
        Ok(())
    }

    /// Width of the q projection output.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }
    /// Width of the k (and v) projection output.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// The `config.json` value in Hugging Face format.
    pub fn to_json(&self) -> Value {
        let (model_type, arch) = match self.arch {
            Arch::Llama => ("llama", "LlamaForCausalLM"),
            Arch::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        };
        let mut v = json!({
            "architectures": [arch],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "float32",
            "use_cache": true,
        });
        if let Value::Object(m) = &mut v {
            if self.arch == Arch::Llama {
                m.insert("attention_bias".into(), json!(self.qkv_bias));
                m.insert("mlp_bias".into(), json!(false));
            }
            if let Some(b) = self.bos_token_id {
                m.insert("bos_token_id".into(), json!(b));
            }
            match self.eos_token_ids.as_slice() {
                [] => {}
                [one] => {
                    m.insert("eos_token_id".into(), json!(one));
                }
                many => {
                    m.insert("eos_token_id".into(), json!(many));
                }
            }
        }
        v
    }

    /// Writes `dir/config.json`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join("config.json");
        let text =
            serde_json::to_string_pretty(&self.to_json()).map_err(|e| NativeError::Json {
                path: path.clone(),
                message: e.to_string(),
            })?;
        std::fs::write(&path, text).map_err(|e| NativeError::io(&path, e))
    }
}
