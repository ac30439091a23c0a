//! `DrafterConfig`: the EAGLE-3 drafter's `config.json`, in the layout vLLM's
//! `Eagle3LlamaForCausalLM` and SGLang's `LlamaForCausalLMEagle3` read (keys listed in
//! [`crate::drafter`]'s module doc).
//!
//! Parsing rejects what the drafter does not implement (more than one decoder layer, tied
//! embeddings, biases, rope scaling, `norm_before_residual`, no aux hidden states) with one
//! message naming the file and the key.

use std::path::Path;

use serde_json::{Value, json};

use crate::error::{NativeError, Result};

/// The architecture name written into `config.json` (SGLang's class; vLLM maps it to its
/// `Eagle3LlamaForCausalLM`).
pub const ARCHITECTURE: &str = "LlamaForCausalLMEagle3";
/// Largest size any config dimension may have.
const MAX_SIZE: usize = 1 << 26;
/// vLLM's own class name, also accepted on load.
const VLLM_ARCHITECTURE: &str = "Eagle3LlamaForCausalLM";

/// Architecture of an EAGLE-3 drafter: one Llama decoder layer whose q/k/v read the
/// `[embedding ‖ hidden]` concatenation, an `fc` from three target residual streams, and an
/// lm_head over a (possibly smaller) draft vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    /// Drafter width `H` (equals the target's when the embedding is the target's).
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA); divides `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// RMSNorm epsilon (all four norms).
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Longest position (RoPE table size, capped by [`crate::model::MAX_ROPE_POSITIONS`]).
    pub max_position_embeddings: usize,
    /// Target vocabulary (rows of `embed_tokens`, length of `t2d`).
    pub vocab_size: usize,
    /// Draft vocabulary (rows of `lm_head`, length of `d2t`).
    pub draft_vocab_size: usize,
    /// Width of each target residual stream (`fc` reads `3 · target_hidden_size`).
    pub target_hidden_size: usize,
    /// Target layers whose INPUT residual streams make the features, in feature order
    /// (`eagle_aux_hidden_state_layer_ids`).
    pub aux_layers: [usize; 3],
}

fn req(v: &Value, key: &str, path: &Path) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| cfg_err(path, format!("missing or non-integer `{key}`")))
}

fn opt(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize)
}

fn cfg_err(path: &Path, msg: String) -> NativeError {
    NativeError::Config(format!("drafter {}: {msg}", path.display()))
}

/// Reads a list of exactly three layer ids, or `None` when the key is absent / null.
fn ids(v: Option<&Value>, key: &str, path: &Path) -> Result<Option<[usize; 3]>> {
    let Some(v) = v.and_then(|v| v.get(key)).filter(|x| !x.is_null()) else {
        return Ok(None);
    };
    let list: Option<Vec<usize>> = v.as_array().map(|a| {
        a.iter()
            .filter_map(|x| x.as_u64().map(|x| x as usize))
            .collect()
    });
    match list.as_deref() {
        Some(&[a, b, c]) if v.as_array().is_some_and(|x| x.len() == 3) => Ok(Some([a, b, c])),
        _ => Err(cfg_err(
            path,
            format!("`{key}` must list exactly three layer ids, got {v}"),
        )),
    }
}

impl DrafterConfig {
    /// Parses a drafter `config.json` value (`path` names the file in errors). The aux layer
    /// ids come from `eagle_aux_hidden_state_layer_ids` (top level, as current vLLM reads
    /// it), else from `eagle_config.eagle_aux_hidden_state_layer_ids` (older vLLM), else
    /// from `default_aux` (the target's defaults); none of these is an error.
    pub fn from_json(v: &Value, path: &Path, default_aux: Option<[usize; 3]>) -> Result<Self> {
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !archs
            .iter()
            .any(|a| *a == ARCHITECTURE || *a == VLLM_ARCHITECTURE)
        {
            return Err(cfg_err(
                path,
                format!("architectures {archs:?} is not an EAGLE-3 drafter (`{ARCHITECTURE}`)"),
            ));
        }
        let model_type = v.get("model_type").and_then(Value::as_str);
        if model_type.is_some_and(|m| m != "llama") {
            return Err(cfg_err(
                path,
                format!("model_type {model_type:?} is not supported (only `llama`)"),
            ));
        }
        let layers = req(v, "num_hidden_layers", path)?;
        if layers != 1 {
            return Err(cfg_err(
                path,
                format!("num_hidden_layers = {layers}: only one-layer drafters are supported"),
            ));
        }
        let flag = |k: &str| v.get(k).and_then(Value::as_bool) == Some(true);
        for key in [
            "tie_word_embeddings",
            "attention_bias",
            "mlp_bias",
            "bias",
            "norm_before_residual",
        ] {
            if flag(key) {
                return Err(cfg_err(
                    path,
                    format!("`{key}: true` is not supported by this drafter"),
                ));
            }
        }
        if let Some(s) = v.get("rope_scaling").filter(|s| !s.is_null()) {
            return Err(cfg_err(path, format!("rope scaling {s} is not supported")));
        }
        let act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            return Err(cfg_err(
                path,
                format!("hidden_act `{act}` not supported (only silu)"),
            ));
        }
        let eagle = v.get("eagle_config").filter(|e| e.is_object());
        if eagle.and_then(|e| e.get("use_aux_hidden_state")) == Some(&Value::Bool(false)) {
            return Err(cfg_err(
                path,
                "eagle_config.use_aux_hidden_state = false (EAGLE-1 style) is not supported".into(),
            ));
        }
        let key = "eagle_aux_hidden_state_layer_ids";
        let aux = match ids(Some(v), key, path)? {
            Some(a) => a,
            None => match ids(eagle, key, path)? {
                Some(a) => a,
                None => default_aux.ok_or_else(|| {
                    cfg_err(
                        path,
                        format!("no `{key}`: load it with its target model to use the defaults"),
                    )
                })?,
            },
        };
        let hidden_size = req(v, "hidden_size", path)?;
        let heads = req(v, "num_attention_heads", path)?;
        let vocab = req(v, "vocab_size", path)?;
        let rope_theta = v
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| {
                v.get("rope_parameters")
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10000.0);
        let cfg = DrafterConfig {
            hidden_size,
            intermediate_size: req(v, "intermediate_size", path)?,
            num_attention_heads: heads,
            num_key_value_heads: opt(v, "num_key_value_heads").unwrap_or(heads),
            head_dim: opt(v, "head_dim").unwrap_or(hidden_size / heads.max(1)),
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            max_position_embeddings: opt(v, "max_position_embeddings").unwrap_or(2048),
            vocab_size: vocab,
            draft_vocab_size: opt(v, "draft_vocab_size").unwrap_or(vocab),
            target_hidden_size: opt(v, "target_hidden_size").unwrap_or(hidden_size),
            aux_layers: aux,
        };
        cfg.validate().map_err(|e| cfg_err(path, e))?;
        Ok(cfg)
    }

    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path, default_aux: Option<[usize; 3]>) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| NativeError::io(&path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| NativeError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::from_json(&v, &path, default_aux)
    }

    /// Internal consistency; the error text says what is wrong.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let sizes = [
            self.hidden_size,
            self.intermediate_size,
            self.num_attention_heads,
            self.head_dim,
            self.vocab_size,
            self.draft_vocab_size,
            self.target_hidden_size,
            self.max_position_embeddings,
        ];
        if sizes.contains(&0) {
            return Err(format!("sizes must be > 0: {self:?}"));
        }
        // Far above any real drafter; keeps a corrupt config from asking for absurd tables.
        if sizes.iter().any(|&x| x > MAX_SIZE) || self.head_dim > 4096 {
            return Err(format!(
                "sizes above {MAX_SIZE} (or head_dim above 4096) are not plausible: {self:?}"
            ));
        }
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {} must be even", self.head_dim));
        }
        if self.draft_vocab_size > self.vocab_size {
            return Err(format!(
                "draft_vocab_size {} exceeds vocab_size {}",
                self.draft_vocab_size, self.vocab_size
            ));
        }
        Ok(())
    }

    /// Width of the q projection output.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }
    /// Width of the k (and v) projection outputs.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
    /// Width of the aux features `fc` reads (`3 · target_hidden_size`).
    pub fn feat_dim(&self) -> usize {
        3 * self.target_hidden_size
    }

    /// The `config.json` value. The aux layer ids are written both at the top level (current
    /// vLLM) and under `eagle_config` (older vLLM and tools reading that block).
    pub fn to_json(&self) -> Value {
        json!({
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": false,
            "attention_bias": false,
            "mlp_bias": false,
            "norm_before_residual": false,
            "torch_dtype": "float32",
            "eagle_aux_hidden_state_layer_ids": self.aux_layers,
            "eagle_config": {
                "use_aux_hidden_state": true,
                "eagle_aux_hidden_state_layer_ids": self.aux_layers,
            },
        })
    }

    /// Errors unless a drafter of this configuration fits `target`: the features' width, the
    /// vocabulary and the aux layer ids (each below the target's layer count).
    pub fn check_target(&self, target: &crate::config::ModelConfig) -> Result<()> {
        if self.target_hidden_size != target.hidden_size {
            return Err(NativeError::Config(format!(
                "drafter expects target hidden size {} (fc reads 3 x {} features), the target \
                 has hidden_size {}",
                self.target_hidden_size, self.target_hidden_size, target.hidden_size
            )));
        }
        if self.vocab_size != target.vocab_size {
            return Err(NativeError::Config(format!(
                "drafter vocab_size {} differs from the target's vocab_size {}: d2t/t2d map \
                 another vocabulary",
                self.vocab_size, target.vocab_size
            )));
        }
        let layers = target.num_hidden_layers;
        if let Some(&bad) = self.aux_layers.iter().find(|&&l| l >= layers) {
            return Err(NativeError::Config(format!(
                "drafter aux layer id {bad} (of {:?}) is out of range: the target has {layers} \
                 layers, ids must be < {layers}",
                self.aux_layers
            )));
        }
        Ok(())
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
