//! candle-transformers' own Llama / Qwen2 (inference path, fused ops) on a model directory.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{llama, qwen2};

use crate::config::{Arch, RefConfig};
use crate::{RefError, Result};

enum Net {
    Llama(llama::Llama, llama::Config),
    Qwen2(qwen2::ModelForCausalLM),
}

/// A model loaded into candle-transformers.
pub struct InferModel {
    /// The configuration read from the directory.
    pub cfg: RefConfig,
    net: Net,
}

/// Result of [`InferModel::generate_greedy`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Generated tokens per row (the first comes from the prefill).
    pub tokens: Vec<Vec<u32>>,
    /// Seconds spent in the prefill (prompt forward + first token).
    pub prefill_s: f64,
    /// Seconds spent in the decode steps after the prefill.
    pub decode_s: f64,
}

/// Loads `dir/model.safetensors` as f32 tensors on the CPU.
pub(crate) fn load_tensors(dir: &Path) -> Result<HashMap<String, Tensor>> {
    let path = dir.join("model.safetensors");
    if !path.is_file() {
        return Err(RefError::Config(format!(
            "{}: not found (the candle reference reads one unsharded file)",
            path.display()
        )));
    }
    let ts = candle_core::safetensors::load(&path, &Device::Cpu)?;
    ts.into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(DType::F32)?)))
        .collect()
}

impl InferModel {
    /// Loads `dir` (config.json + model.safetensors) into candle-transformers' model of its
    /// architecture.
    pub fn load(dir: &Path) -> Result<Self> {
        let cfg = RefConfig::load(dir)?;
        if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size {
            return Err(RefError::Config(format!(
                "head_dim {} × heads {} != hidden_size {}: candle-transformers derives head_dim from hidden_size",
                cfg.head_dim, cfg.num_attention_heads, cfg.hidden_size
            )));
        }
        let vb = VarBuilder::from_tensors(load_tensors(dir)?, DType::F32, &Device::Cpu);
        let net = match cfg.arch {
            Arch::Llama => {
                if cfg.qkv_bias || cfg.o_bias {
                    return Err(RefError::Config(
                        "candle-transformers' Llama has no attention biases (attention_bias: true)"
                            .into(),
                    ));
                }
                let c = llama::Config {
                    hidden_size: cfg.hidden_size,
                    intermediate_size: cfg.intermediate_size,
                    vocab_size: cfg.vocab_size,
                    num_hidden_layers: cfg.num_hidden_layers,
                    num_attention_heads: cfg.num_attention_heads,
                    num_key_value_heads: cfg.num_key_value_heads,
                    use_flash_attn: false,
                    rms_norm_eps: cfg.rms_norm_eps,
                    rope_theta: cfg.rope_theta as f32,
                    bos_token_id: None,
                    eos_token_id: None,
                    rope_scaling: None,
                    max_position_embeddings: cfg.max_position_embeddings,
                    tie_word_embeddings: cfg.tie_word_embeddings,
                };
                Net::Llama(llama::Llama::load(vb, &c)?, c)
            }
            Arch::Qwen2 => {
                let c = qwen2::Config {
                    vocab_size: cfg.vocab_size,
                    hidden_size: cfg.hidden_size,
                    intermediate_size: cfg.intermediate_size,
                    num_hidden_layers: cfg.num_hidden_layers,
                    num_attention_heads: cfg.num_attention_heads,
                    num_key_value_heads: cfg.num_key_value_heads,
                    max_position_embeddings: cfg.max_position_embeddings,
                    sliding_window: cfg.max_position_embeddings,
                    max_window_layers: cfg.num_hidden_layers,
                    tie_word_embeddings: cfg.tie_word_embeddings,
                    rope_theta: cfg.rope_theta,
                    rms_norm_eps: cfg.rms_norm_eps,
                    use_sliding_window: false,
                    hidden_act: candle_nn::Activation::Silu,
                };
                Net::Qwen2(qwen2::ModelForCausalLM::new(&c, vb)?)
            }
        };
        Ok(InferModel { cfg, net })
    }

    /// Runs `steps` forward calls through one fresh KV cache: first `first` ([b, t]), then
    /// one token per row chosen by `next` from the last logits. Returns the last-position
    /// logits `[b, vocab]` of every call, and the time of the first call and of the rest.
    fn run(
        &mut self,
        first: Tensor,
        steps: usize,
        mut next: impl FnMut(&Tensor) -> Result<Tensor>,
        mut keep: impl FnMut(&Tensor) -> Result<()>,
    ) -> Result<(f64, f64)> {
        let (_, t) = first.dims2()?;
        let mut cache = match &mut self.net {
            Net::Llama(_, c) => Some(llama::Cache::new(true, DType::F32, c, &Device::Cpu)?),
            Net::Qwen2(m) => {
                m.clear_kv_cache();
                None
            }
        };
        let mut input = first;
        let mut pos = 0;
        let mut first_s = 0.0;
        let t0 = Instant::now();
        for step in 0..steps {
            let logits = match (&mut self.net, cache.as_mut()) {
                (Net::Llama(m, _), Some(c)) => m.forward(&input, pos, c)?,
                (Net::Qwen2(m), _) => m.forward(&input, pos)?.squeeze(1)?,
                (Net::Llama(..), None) => {
                    return Err(RefError::Config(
                        "internal: llama run without a cache".into(),
                    ));
                }
            };
            keep(&logits)?;
            pos += if step == 0 { t } else { 1 };
            input = next(&logits)?;
            if step == 0 {
                first_s = t0.elapsed().as_secs_f64();
            }
        }
        Ok((first_s, t0.elapsed().as_secs_f64() - first_s))
    }

    /// Last-position logits `[b · vocab]` of each row of `tokens` (`[b, t]` row-major),
    /// followed by the logits after feeding `extra` (one token per row, `[b]`) through the
    /// KV cache — so both the prefill and a cached decode step are covered.
    pub fn logits(&mut self, tokens: &[u32], b: usize, extra: &[u32]) -> Result<Vec<Vec<f32>>> {
        let t = tokens.len() / b.max(1);
        let first = Tensor::from_slice(tokens, (b, t), &Device::Cpu)?;
        let extra = Tensor::from_slice(extra, (b, 1), &Device::Cpu)?;
        let mut out = Vec::new();
        self.run(
            first,
            2,
            |_| Ok(extra.clone()),
            |l| {
                out.push(l.flatten_all()?.to_vec1::<f32>()?);
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// Greedy (argmax) generation of `new_tokens` tokens for every row of `prompts`
    /// (`[b, t]` row-major), timing the prefill and the decode steps separately.
    pub fn generate_greedy(
        &mut self,
        prompts: &[u32],
        b: usize,
        new_tokens: usize,
    ) -> Result<Decoded> {
        let t = prompts.len() / b.max(1);
        let first = Tensor::from_slice(prompts, (b, t), &Device::Cpu)?;
        let mut rows = vec![Vec::with_capacity(new_tokens); b];
        let (prefill_s, decode_s) = self.run(
            first,
            new_tokens,
            |l| {
                let ids = l.argmax(D::Minus1)?;
                for (r, id) in rows.iter_mut().zip(ids.to_vec1::<u32>()?) {
                    r.push(id);
                }
                Ok(ids.unsqueeze(1)?)
            },
            |_| Ok(()),
        )?;
        Ok(Decoded {
            tokens: rows,
            prefill_s,
            decode_s,
        })
    }
}
