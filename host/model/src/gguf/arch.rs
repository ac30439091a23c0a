//! From GGUF (llama.cpp names and metadata) to the Hugging Face layout: the model's
//! hyper-parameters, `config.json`, and each tensor's HF name, shape and row order.
//!
//! Supported architectures: `llama` (Q and K rows permuted by llama.cpp's converter, undone
//! here) and `qwen2` (no permutation, Q/K/V biases). Rope scaling is refused: the file would
//! need `rope_scaling` in `config.json` and no Tandem engine implements it yet.

use super::reader::{Gguf, Value};
use serde_json::json;

/// Hyper-parameters read from the metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    /// `general.architecture`.
    pub arch: String,
    /// Decoder layers.
    pub layers: usize,
    /// Model width.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length.
    pub context: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Whether the file has no `output.weight` (the LM head is the embedding).
    pub tied: bool,
}

/// The architectures this importer knows.
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2"];

impl Hparams {
    /// Reads the hyper-parameters; `Err` names the missing or bad key.
    pub fn read(g: &Gguf) -> Result<Hparams, String> {
        let arch = g
            .meta
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or("metadata has no `general.architecture`")?
            .to_owned();
        if !ARCHITECTURES.contains(&arch.as_str()) {
            return Err(format!(
                "architecture `{arch}` is not supported (supported: {})",
                ARCHITECTURES.join(", ")
            ));
        }
        let int = |key: &str| -> Result<usize, String> {
            let full = format!("{arch}.{key}");
            g.meta
                .get(&full)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .filter(|&v| v > 0)
                .ok_or(format!(
                    "metadata `{full}` is missing or not a positive integer"
                ))
        };
        let float = |key: &str, default: Option<f64>| -> Result<f64, String> {
            let full = format!("{arch}.{key}");
            match g.meta.get(&full) {
                Some(v) => v
                    .as_f64()
                    .ok_or(format!("metadata `{full}` is not a number")),
                None => default.ok_or(format!("metadata `{full}` is missing")),
            }
        };
        if let Some(kind) = g.meta.get(&format!("{arch}.rope.scaling.type"))
            && kind.as_str() != Some("none")
        {
            return Err(format!(
                "rope scaling {kind:?} is not supported (Tandem's engines implement plain RoPE)"
            ));
        }
        let hidden = int("embedding_length")?;
        let heads = int("attention.head_count")?;
        let kv_heads = g
            .meta
            .contains_key(&format!("{arch}.attention.head_count_kv"))
            .then(|| int("attention.head_count_kv"))
            .transpose()?
            .unwrap_or(heads);
        let head_dim = if g.meta.contains_key(&format!("{arch}.attention.key_length")) {
            int("attention.key_length")?
        } else {
            hidden / heads
        };
        if !heads.is_multiple_of(kv_heads) || !head_dim.is_multiple_of(2) {
            return Err(format!(
                "{heads} heads over {kv_heads} KV heads of width {head_dim} is not a valid \
                 attention layout"
            ));
        }
        let tokens = g
            .meta
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(<[Value]>::len);
        let vocab = match g.meta.get(&format!("{arch}.vocab_size")) {
            Some(_) => int("vocab_size")?,
            None => tokens.ok_or("metadata has neither a vocab_size nor tokenizer tokens")?,
        };
        Ok(Hparams {
            layers: int("block_count")?,
            hidden,
            intermediate: int("feed_forward_length")?,
            heads,
            kv_heads,
            head_dim,
            vocab,
            context: int("context_length")?,
            rope_theta: float("rope.freq_base", Some(10_000.0))?,
            rms_eps: float("attention.layer_norm_rms_epsilon", None)?,
            tied: !g.tensors.iter().any(|t| t.name == "output.weight"),
            arch,
        })
    }

    /// `config.json` of the HF model (`bos`/`eos`/`pad` ids from the tokenizer metadata).
    pub fn config_json(
        &self,
        bos: Option<u32>,
        eos: Option<u32>,
        pad: Option<u32>,
    ) -> serde_json::Value {
        let (class, model_type) = match self.arch.as_str() {
            "qwen2" => ("Qwen2ForCausalLM", "qwen2"),
            _ => ("LlamaForCausalLM", "llama"),
        };
        // f32 metadata written back at f32 precision (1e-5, not 9.999999747378752e-6).
        let eps: f64 = format!("{}", self.rms_eps as f32)
            .parse()
            .unwrap_or(self.rms_eps);
        let mut c = json!({
            "architectures": [class],
            "model_type": model_type,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.context,
            "rms_norm_eps": eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "tie_word_embeddings": self.tied,
            "torch_dtype": "float32",
            "initializer_range": 0.02,
            "use_cache": true,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": pad,
        });
        if model_type == "llama" {
            c["attention_bias"] = json!(false);
            c["mlp_bias"] = json!(false);
        }
        c
    }

    /// Every tensor the file must have: GGUF name → what it becomes.
    pub fn tensors(&self) -> Vec<(String, Target)> {
        let (h, kv, f) = (
            self.hidden,
            self.kv_heads * self.head_dim,
            self.intermediate,
        );
        let q = self.heads * self.head_dim;
        let plain = |hf: &str, shape: Vec<usize>| Target {
            hf: hf.to_owned(),
            shape,
            unpermute_heads: None,
        };
        let mut out = vec![
            (
                "token_embd.weight".into(),
                plain("model.embed_tokens.weight", vec![self.vocab, h]),
            ),
            (
                "output_norm.weight".into(),
                plain("model.norm.weight", vec![h]),
            ),
        ];
        if !self.tied {
            out.push((
                "output.weight".into(),
                plain("lm_head.weight", vec![self.vocab, h]),
            ));
        }
        let llama = self.arch == "llama";
        for i in 0..self.layers {
            let b = |g: &str| format!("blk.{i}.{g}");
            let l = |n: &str| format!("model.layers.{i}.{n}");
            let mut qk = |gg: &str, hf: &str, rows: usize, heads: usize| {
                let mut t = plain(&l(hf), vec![rows, h]);
                t.unpermute_heads = llama.then_some(heads);
                out.push((b(gg), t));
            };
            qk("attn_q.weight", "self_attn.q_proj.weight", q, self.heads);
            qk(
                "attn_k.weight",
                "self_attn.k_proj.weight",
                kv,
                self.kv_heads,
            );
            for (gg, hf, shape) in [
                ("attn_norm.weight", "input_layernorm.weight", vec![h]),
                (
                    "ffn_norm.weight",
                    "post_attention_layernorm.weight",
                    vec![h],
                ),
                ("attn_v.weight", "self_attn.v_proj.weight", vec![kv, h]),
                ("attn_output.weight", "self_attn.o_proj.weight", vec![h, q]),
                ("ffn_gate.weight", "mlp.gate_proj.weight", vec![f, h]),
                ("ffn_up.weight", "mlp.up_proj.weight", vec![f, h]),
                ("ffn_down.weight", "mlp.down_proj.weight", vec![h, f]),
            ] {
                out.push((b(gg), plain(&l(hf), shape)));
            }
            if !llama {
                for (gg, hf, n) in [
                    ("attn_q.bias", "self_attn.q_proj.bias", q),
                    ("attn_k.bias", "self_attn.k_proj.bias", kv),
                    ("attn_v.bias", "self_attn.v_proj.bias", kv),
                ] {
                    out.push((b(gg), plain(&l(hf), vec![n])));
                }
            }
        }
        out
    }
}

/// What one GGUF tensor becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Hugging Face name.
    pub hf: String,
    /// HF shape (outermost first; GGUF lists the same dimensions innermost first).
    pub shape: Vec<usize>,
    /// `Some(heads)`: rows were permuted per head by llama.cpp's converter (Q and K).
    pub unpermute_heads: Option<usize>,
}

/// Undoes llama.cpp's per-head row permutation of a `[rows, cols]` matrix in place of `src`.
///
/// Within each head of `2·half` rows, llama.cpp stores HF row `j·half + d` (`j` ∈ {0, 1})
/// at row `2·d + j` (interleaved halves for its RoPE); this puts each back.
pub fn unpermute(src: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = src.len() / cols;
    let half = rows / heads / 2;
    let mut out = vec![0f32; src.len()];
    for h in 0..heads {
        for j in 0..2 {
            for d in 0..half {
                let to = (h * 2 * half + j * half + d) * cols;
                let from = (h * 2 * half + 2 * d + j) * cols;
                out[to..to + cols].copy_from_slice(&src[from..from + cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: reshape(heads, 2, half, cols).swapaxes(1, 2) — HF row (h, j, d) goes to
        // GGUF row (h, d, j).
        let (heads, half, cols) = (3, 4, 2);
        let rows = heads * 2 * half;
        let hf: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
        let mut gguf = vec![0f32; hf.len()];
        for h in 0..heads {
            for j in 0..2 {
                for d in 0..half {
                    let from = (h * 2 * half + j * half + d) * cols;
                    let to = (h * 2 * half + 2 * d + j) * cols;
                    gguf[to..to + cols].copy_from_slice(&hf[from..from + cols]);
                }
            }
        }
        assert_eq!(unpermute(&gguf, heads, cols), hf);
    }
}
