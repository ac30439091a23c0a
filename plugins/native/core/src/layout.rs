//! `ParamLayout`: Hugging Face parameter names -> (shape, offset) inside ONE flat f32 buffer.
//!
//! Weights, gradients and the two AdamW moments all use the same layout, so a parameter sits
//! at the same offset in each of those buffers. [`ModelOffsets`] caches the ranges compute
//! code needs so the hot path never looks names up.

use std::collections::HashMap;
use std::ops::Range;

use crate::config::ModelConfig;
use crate::error::{NativeError, Result};
use crate::lora::Target;

/// One named tensor in a flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamEntry {
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Shape in Hugging Face order (Linear weights are `[out, in]`).
    pub shape: Vec<usize>,
    /// First f32 element in the buffer.
    pub offset: usize,
}

impl ParamEntry {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Element range in the buffer.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel()
    }
}

/// Ordered name -> (shape, offset) map over one flat f32 buffer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamLayout {
    entries: Vec<ParamEntry>,
    index: HashMap<String, usize>,
    total: usize,
}

/// Alignment (in f32 elements) of each tensor's offset: 16 floats = 64 bytes.
const ALIGN: usize = 16;

impl ParamLayout {
    /// An empty layout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a tensor; returns its range.
    pub fn push(&mut self, name: impl Into<String>, shape: Vec<usize>) -> Range<usize> {
        let name = name.into();
        let offset = self.total.div_ceil(ALIGN) * ALIGN;
        let e = ParamEntry {
            name: name.clone(),
            shape,
            offset,
        };
        let r = e.range();
        self.total = r.end;
        self.index.insert(name, self.entries.len());
        self.entries.push(e);
        r
    }

    /// Total f32 elements the buffer must hold.
    pub fn total_len(&self) -> usize {
        self.total
    }

    /// Number of parameters (sum of tensor sizes, excluding alignment padding).
    pub fn num_params(&self) -> usize {
        self.entries.iter().map(ParamEntry::numel).sum()
    }

    /// All tensors in buffer order.
    pub fn entries(&self) -> &[ParamEntry] {
        &self.entries
    }

    /// Looks a tensor up by name.
    pub fn get(&self, name: &str) -> Option<&ParamEntry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }

    /// Looks a tensor up by name, erroring with the name when absent.
    pub fn require(&self, name: &str) -> Result<&ParamEntry> {
        self.get(name)
            .ok_or_else(|| NativeError::Param(format!("no parameter named `{name}` in the layout")))
    }

    /// The layout of a Llama/Qwen2 model with Hugging Face names.
    pub fn for_model(cfg: &ModelConfig) -> (Self, ModelOffsets) {
        let mut l = ParamLayout::new();
        let d = cfg.hidden_size;
        let embed = l.push("model.embed_tokens.weight", vec![cfg.vocab_size, d]);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let ln1 = l.push(p("input_layernorm.weight"), vec![d]);
            let q = l.push(p("self_attn.q_proj.weight"), vec![cfg.q_dim(), d]);
            let k = l.push(p("self_attn.k_proj.weight"), vec![cfg.kv_dim(), d]);
            let v = l.push(p("self_attn.v_proj.weight"), vec![cfg.kv_dim(), d]);
            let (q_b, k_b, v_b) = if cfg.qkv_bias {
                (
                    Some(l.push(p("self_attn.q_proj.bias"), vec![cfg.q_dim()])),
                    Some(l.push(p("self_attn.k_proj.bias"), vec![cfg.kv_dim()])),
                    Some(l.push(p("self_attn.v_proj.bias"), vec![cfg.kv_dim()])),
                )
            } else {
                (None, None, None)
            };
            let o = l.push(p("self_attn.o_proj.weight"), vec![d, cfg.q_dim()]);
            let o_b = cfg
                .o_bias
                .then(|| l.push(p("self_attn.o_proj.bias"), vec![d]));
            let ln2 = l.push(p("post_attention_layernorm.weight"), vec![d]);
            let gate = l.push(p("mlp.gate_proj.weight"), vec![cfg.intermediate_size, d]);
            let up = l.push(p("mlp.up_proj.weight"), vec![cfg.intermediate_size, d]);
            let down = l.push(p("mlp.down_proj.weight"), vec![d, cfg.intermediate_size]);
            layers.push(LayerOffsets {
                ln1,
                q,
                k,
                v,
                q_b,
                k_b,
                v_b,
                o,
                o_b,
                ln2,
                gate,
                up,
                down,
            });
        }
        let norm = l.push("model.norm.weight", vec![d]);
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            l.push("lm_head.weight", vec![cfg.vocab_size, d])
        };
        (
            l,
            ModelOffsets {
                embed,
                layers,
                norm,
                lm_head,
            },
        )
    }
}

/// Ranges of one decoder layer's tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerOffsets {
    /// input_layernorm weight.
    pub ln1: Range<usize>,
    /// q_proj weight `[q_dim, d]`.
    pub q: Range<usize>,
    /// k_proj weight `[kv_dim, d]`.
    pub k: Range<usize>,
    /// v_proj weight `[kv_dim, d]`.
    pub v: Range<usize>,
    /// q_proj bias.
    pub q_b: Option<Range<usize>>,
    /// k_proj bias.
    pub k_b: Option<Range<usize>>,
    /// v_proj bias.
    pub v_b: Option<Range<usize>>,
    /// o_proj weight `[d, q_dim]`.
    pub o: Range<usize>,
    /// o_proj bias.
    pub o_b: Option<Range<usize>>,
    /// post_attention_layernorm weight.
    pub ln2: Range<usize>,
    /// gate_proj weight `[ff, d]`.
    pub gate: Range<usize>,
    /// up_proj weight `[ff, d]`.
    pub up: Range<usize>,
    /// down_proj weight `[d, ff]`.
    pub down: Range<usize>,
}

impl LayerOffsets {
    /// Weight and bias ranges of projection `t` (the MLP's have no bias).
    pub fn proj(&self, t: Target) -> (&Range<usize>, &Option<Range<usize>>) {
        match t {
            Target::Q => (&self.q, &self.q_b),
            Target::K => (&self.k, &self.k_b),
            Target::V => (&self.v, &self.v_b),
            Target::O => (&self.o, &self.o_b),
            Target::Gate => (&self.gate, &None),
            Target::Up => (&self.up, &None),
            Target::Down => (&self.down, &None),
        }
    }
}

/// Ranges of every tensor of the model (the lm_head range equals the embedding's when tied).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelOffsets {
    /// Embedding `[vocab, d]`.
    pub embed: Range<usize>,
    /// Per-layer ranges.
    pub layers: Vec<LayerOffsets>,
    /// Final norm weight.
    pub norm: Range<usize>,
    /// lm_head `[vocab, d]` (same as `embed` when tied).
    pub lm_head: Range<usize>,
}
