//! The drafter's parameter layout: checkpoint names → ranges of the `weights/drafter`
//! buffer, trainable tensors first and the frozen `embed_tokens.weight` last (so the
//! trainable parameters are one prefix of the buffer).

use std::ops::Range;

use super::config::DrafterConfig;
use crate::layout::ParamLayout;

/// Ranges of every drafter tensor in the weights buffer (and, for the trainable ones, in the
/// gradient and moment buffers, which cover the prefix `0..embed.start`).
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterOffsets {
    /// `fc.weight` `[H, 3·H_target]`.
    pub fc: Range<usize>,
    /// `midlayer.input_layernorm.weight` `[H]` (embedding norm).
    pub ln_in: Range<usize>,
    /// `midlayer.hidden_norm.weight` `[H]`.
    pub ln_hidden: Range<usize>,
    /// `midlayer.self_attn.q_proj.weight` `[q_dim, 2H]`.
    pub q: Range<usize>,
    /// `midlayer.self_attn.k_proj.weight` `[kv_dim, 2H]`.
    pub k: Range<usize>,
    /// `midlayer.self_attn.v_proj.weight` `[kv_dim, 2H]`.
    pub v: Range<usize>,
    /// `midlayer.self_attn.o_proj.weight` `[H, q_dim]`.
    pub o: Range<usize>,
    /// `midlayer.post_attention_layernorm.weight` `[H]`.
    pub ln_post: Range<usize>,
    /// `midlayer.mlp.gate_proj.weight` `[F, H]`.
    pub gate: Range<usize>,
    /// `midlayer.mlp.up_proj.weight` `[F, H]`.
    pub up: Range<usize>,
    /// `midlayer.mlp.down_proj.weight` `[H, F]`.
    pub down: Range<usize>,
    /// `norm.weight` `[H]`.
    pub norm: Range<usize>,
    /// `lm_head.weight` `[draft_vocab, H]`.
    pub lm_head: Range<usize>,
    /// `embed_tokens.weight` `[vocab, H]`, frozen, last.
    pub embed: Range<usize>,
}

/// Name of the frozen embedding tensor.
pub const EMBED: &str = "embed_tokens.weight";

/// The layout of a drafter with config `c`.
pub fn drafter_layout(c: &DrafterConfig) -> (ParamLayout, DrafterOffsets) {
    let mut l = ParamLayout::new();
    let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let m = |s: &str| format!("midlayer.{s}");
    let fc = l.push("fc.weight", vec![h, c.feat_dim()]);
    let ln_in = l.push(m("input_layernorm.weight"), vec![h]);
    let ln_hidden = l.push(m("hidden_norm.weight"), vec![h]);
    let q = l.push(m("self_attn.q_proj.weight"), vec![qd, 2 * h]);
    let k = l.push(m("self_attn.k_proj.weight"), vec![kvd, 2 * h]);
    let v = l.push(m("self_attn.v_proj.weight"), vec![kvd, 2 * h]);
    let o = l.push(m("self_attn.o_proj.weight"), vec![h, qd]);
    let ln_post = l.push(m("post_attention_layernorm.weight"), vec![h]);
    let gate = l.push(m("mlp.gate_proj.weight"), vec![ff, h]);
    let up = l.push(m("mlp.up_proj.weight"), vec![ff, h]);
    let down = l.push(m("mlp.down_proj.weight"), vec![h, ff]);
    let norm = l.push("norm.weight", vec![h]);
    let lm_head = l.push("lm_head.weight", vec![c.draft_vocab_size, h]);
    let embed = l.push(EMBED, vec![c.vocab_size, h]);
    (
        l,
        DrafterOffsets {
            fc,
            ln_in,
            ln_hidden,
            q,
            k,
            v,
            o,
            ln_post,
            gate,
            up,
            down,
            norm,
            lm_head,
            embed,
        },
    )
}
