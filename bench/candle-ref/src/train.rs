//! The same Llama / Qwen2 architecture built from candle's differentiable ops, trained with
//! candle's autograd and `candle_nn::AdamW` (full fine-tuning).

use std::path::Path;

use candle_core::{D, DType, Device, Tensor, Var, backprop::GradStore};
use candle_nn::{AdamW, Embedding, Linear, Module, Optimizer, ParamsAdamW};

use crate::config::RefConfig;
use crate::infer::load_tensors;
use crate::{RefError, Result};

struct Layer {
    ln1: Tensor,
    ln2: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A trainable copy of a model directory: every parameter is a candle `Var`.
pub struct TrainModel {
    /// The configuration read from the directory.
    pub cfg: RefConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    vars: Vec<Var>,
    opt: AdamW,
    max_grad_norm: f64,
}

/// What one [`TrainModel::train_step`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Mean next-token cross-entropy before the update.
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
}

impl TrainModel {
    /// Loads `dir` into `Var`s and sets up AdamW (`lr`, β = (0.9, 0.999), ε = 1e-8,
    /// `weight_decay`) and global-norm clipping at `max_grad_norm`.
    pub fn load(dir: &Path, lr: f64, weight_decay: f64, max_grad_norm: f64) -> Result<Self> {
        let cfg = RefConfig::load(dir)?;
        let mut ts = load_tensors(dir)?;
        let mut vars: Vec<Var> = Vec::new();
        let mut take = |name: &str| -> Result<Tensor> {
            let t = ts
                .remove(name)
                .ok_or_else(|| RefError::Config(format!("model.safetensors: no `{name}`")))?;
            let v = Var::from_tensor(&t)?;
            let t = v.as_tensor().clone();
            vars.push(v);
            Ok(t)
        };
        let embed_w = take("model.embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let mut lin = |name: &str, bias: bool| -> Result<Linear> {
                let w = take(&format!("{p}.{name}.weight"))?;
                let b = if bias {
                    Some(take(&format!("{p}.{name}.bias"))?)
                } else {
                    None
                };
                Ok(Linear::new(w, b))
            };
            let q = lin("self_attn.q_proj", cfg.qkv_bias)?;
            let k = lin("self_attn.k_proj", cfg.qkv_bias)?;
            let v = lin("self_attn.v_proj", cfg.qkv_bias)?;
            let o = lin("self_attn.o_proj", cfg.o_bias)?;
            let gate = lin("mlp.gate_proj", false)?;
            let up = lin("mlp.up_proj", false)?;
            let down = lin("mlp.down_proj", false)?;
            layers.push(Layer {
                ln1: take(&format!("{p}.input_layernorm.weight"))?,
                ln2: take(&format!("{p}.post_attention_layernorm.weight"))?,
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
            });
        }
        let norm = take("model.norm.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed_w.clone(), None)
        } else {
            Linear::new(take("lm_head.weight")?, None)
        };
        // RoPE tables [positions, head_dim / 2] (HF default rope: inv_freq = θ^(-2i/d)).
        let half = cfg.head_dim / 2;
        let n = cfg.max_position_embeddings;
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / (cfg.rope_theta as f32).powf((2 * i) as f32 / cfg.head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let params = ParamsAdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        };
        let opt = AdamW::new(vars.clone(), params)?;
        Ok(TrainModel {
            embed: Embedding::new(embed_w, cfg.hidden_size),
            layers,
            norm,
            lm_head,
            cos: Tensor::from_vec(cos, (n, half), &Device::Cpu)?,
            sin: Tensor::from_vec(sin, (n, half), &Device::Cpu)?,
            vars,
            opt,
            max_grad_norm,
            cfg,
        })
    }

    /// Logits `[b, t, vocab]` for `tokens` `[b, t]`.
    fn forward_t(&self, tokens: &Tensor) -> Result<Tensor> {
        let c = &self.cfg;
        let (b, t) = tokens.dims2()?;
        let (h, kvh, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps as f32;
        let cos = self.cos.narrow(0, 0, t)?;
        let sin = self.sin.narrow(0, 0, t)?;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let heads = |x: Tensor, n: usize| -> Result<Tensor> {
            Ok(x.reshape((b, t, n, hd))?.transpose(1, 2)?.contiguous()?)
        };
        let mut x = self.embed.forward(tokens)?;
        for l in &self.layers {
            let y = candle_nn::ops::rms_norm_slow(&x, &l.ln1, eps)?;
            let q = heads(l.q.forward(&y)?, h)?;
            let k = heads(l.k.forward(&y)?, kvh)?;
            let v = heads(l.v.forward(&y)?, kvh)?;
            let q = candle_nn::rotary_emb::rope_slow(&q, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope_slow(&k, &cos, &sin)?;
            let k = candle_transformers::utils::repeat_kv(k, h / kvh)?.contiguous()?;
            let v = candle_transformers::utils::repeat_kv(v, h / kvh)?.contiguous()?;
            let att = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&mask)?;
            let att = candle_nn::ops::softmax(&att, D::Minus1)?;
            let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, h * hd))?;
            x = (x + l.o.forward(&y)?)?;
            let y = candle_nn::ops::rms_norm_slow(&x, &l.ln2, eps)?;
            let m = (l.gate.forward(&y)?.silu()? * l.up.forward(&y)?)?;
            x = (x + l.down.forward(&m)?)?;
        }
        let x = candle_nn::ops::rms_norm_slow(&x, &self.norm, eps)?;
        Ok(self.lm_head.forward(&x)?)
    }

    /// All-position logits `[b · t · vocab]` for `tokens` (`[b, t]` row-major).
    pub fn logits(&self, tokens: &[u32], b: usize) -> Result<Vec<f32>> {
        let t = tokens.len() / b.max(1);
        let x = Tensor::from_slice(tokens, (b, t), &Device::Cpu)?;
        Ok(self.forward_t(&x)?.flatten_all()?.to_vec1::<f32>()?)
    }

    /// One full fine-tuning step on `tokens` (`[b, t]` row-major): forward, mean next-token
    /// cross-entropy over the `b · (t − 1)` targets, backward, global-norm clip, AdamW.
    pub fn train_step(&mut self, tokens: &[u32], b: usize) -> Result<StepReport> {
        let t = tokens.len() / b.max(1);
        let x = Tensor::from_slice(tokens, (b, t), &Device::Cpu)?;
        let logits = self.forward_t(&x)?;
        let v = self.cfg.vocab_size;
        let pred = logits.narrow(1, 0, t - 1)?.reshape((b * (t - 1), v))?;
        let target = x.narrow(1, 1, t - 1)?.flatten_all()?;
        let loss = candle_nn::loss::cross_entropy(&pred, &target)?;
        let mut grads = loss.backward()?;
        let grad_norm = clip(&self.vars, &mut grads, self.max_grad_norm)?;
        self.opt.step(&grads)?;
        Ok(StepReport {
            loss: loss.to_dtype(DType::F32)?.to_scalar::<f32>()?,
            grad_norm,
        })
    }
}

/// PyTorch `clip_grad_norm_`: scales every gradient by `max / (norm + 1e-6)` when that is
/// below 1; returns the norm before clipping.
fn clip(vars: &[Var], grads: &mut GradStore, max: f64) -> Result<f32> {
    let mut sq = 0.0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
    }
    let norm = sq.sqrt();
    let coef = max / (norm + 1e-6);
    if coef < 1.0 {
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * coef)?);
            }
        }
    }
    Ok(norm as f32)
}
