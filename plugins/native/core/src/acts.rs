//! Layout of the `activations` buffer for one forward/backward over `B` sequences of `T`
//! tokens: per layer the tensors backward needs, then the final norm + logits, then scratch.
//! The trainer's layout ([`ActLayout::training`]) holds the chunked head's scratch
//! ([`crate::head`]) where the full logits would be. Every size is a multiple of `N = B·T`
//! (the head scratch: of its rows), so a buffer sized for `N` tokens fits any batch of as many.
//!
//! Per layer (N = B·T): `x_in[N,d] r1[N] h1[N,d] q[B,H,T,hd] k[B,KV,T,hd] v[B,KV,T,hd]
//! lse[B,H,T] att[N,q_dim] x_mid[N,d] r2[N] h2[N,d] g[N,ff] u[N,ff] a[N,ff]` and, for each
//! LoRA target slot, `x·Aᵀ [N,r]` (size 0 when not adapted). `x_in` comes first so a layer
//! writes its output straight into the next layer's (or the final section's) first slot.

use crate::buffer::carve;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::lora::LoraConfig;

/// Number of tensors saved per layer.
pub const LAYER_SLOTS: usize = 21;
/// Number of scratch tensors.
pub const SCRATCH_SLOTS: usize = 12;

/// Sizes and offsets of the activations buffer for one (config, B, T, LoRA) combination.
#[derive(Debug, Clone, PartialEq)]
pub struct ActLayout {
    /// Sequences.
    pub b: usize,
    /// Tokens per sequence.
    pub t: usize,
    /// B·T.
    pub n: usize,
    layer_sizes: [usize; LAYER_SLOTS],
    final_sizes: [usize; 4],
    scratch_sizes: [usize; SCRATCH_SLOTS],
    layers: usize,
    /// Rows of the chunked head's scratch in the final section instead of the full logits
    /// (`None`: the full logits `[N, vocab]`).
    pub head_rows: Option<usize>,
    /// Inference-only: one layer section reused by every layer (no backward possible).
    pub shared: bool,
}

impl ActLayout {
    /// Layout for `b` sequences of `t` tokens (with `lora` adapters if given).
    pub fn new(c: &ModelConfig, b: usize, t: usize, lora: Option<&LoraConfig>) -> Self {
        let n = b * t;
        let (d, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let p = b * c.num_attention_heads * t;
        let mut ls = [
            n * d,
            n,
            n * d,
            n * qd,
            n * kvd,
            n * kvd,
            p,
            n * qd,
            n * d,
            n,
            n * d,
            n * ff,
            n * ff,
            n * ff,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        let mut r = 0;
        if let Some(l) = lora {
            r = l.r;
            for t in &l.targets {
                ls[14 + *t as usize] = n * l.r;
            }
        }
        ActLayout {
            b,
            t,
            n,
            layer_sizes: ls,
            final_sizes: [n * d, n, n * d, n * c.vocab_size],
            scratch_sizes: [
                n * d,
                n * d,
                n * qd,
                n * kvd,
                n * kvd,
                n * qd,
                n * kvd,
                n * kvd,
                n * ff,
                n * ff,
                n * ff,
                n * r,
            ],
            layers: c.num_hidden_layers,
            head_rows: None,
            shared: false,
        }
    }

    /// The trainer's layout: [`new`](Self::new) with the chunked head's scratch of
    /// `head_rows` rows (hidden states + logits, see [`crate::head`]) in place of the full
    /// logits; `forward` then computes no logits.
    pub fn training(
        c: &ModelConfig,
        b: usize,
        t: usize,
        lora: Option<&LoraConfig>,
        head_rows: usize,
    ) -> Self {
        let mut al = Self::new(c, b, t, lora);
        al.final_sizes[3] = crate::head::scratch_len(c.vocab_size, c.hidden_size, head_rows);
        al.head_rows = Some(head_rows);
        al
    }

    /// Inference-only layout (scoring, prefill): one layer section is reused by all layers,
    /// so memory does not grow with depth; [`crate::backward::backward`] rejects it.
    pub fn for_inference(c: &ModelConfig, b: usize, t: usize, lora: Option<&LoraConfig>) -> Self {
        let mut al = Self::new(c, b, t, lora);
        al.layers = c.num_hidden_layers.min(1);
        al.shared = true;
        al
    }

    /// Prefill's layout: [`for_inference`](Self::for_inference) without the full logits
    /// `[N, vocab]` — prefill runs `forward` with `with_logits = false` and projects only the
    /// last position of each prompt — so a prefill's memory does not grow with the
    /// vocabulary (64 prompts of 60 tokens with SmolLM2's 49 152-entry vocabulary: 755 MB).
    pub fn for_prefill(c: &ModelConfig, b: usize, t: usize, lora: Option<&LoraConfig>) -> Self {
        let mut al = Self::for_inference(c, b, t, lora);
        al.final_sizes[3] = 0;
        al
    }

    /// Whether the final section holds the full logits `[N, vocab]` (not a prefill or a
    /// training layout).
    pub fn has_logits(&self) -> bool {
        self.head_rows.is_none() && (self.n == 0 || self.final_sizes[3] > 0)
    }

    /// f32 elements of one layer's section.
    pub fn per_layer(&self) -> usize {
        self.layer_sizes.iter().sum()
    }
    /// f32 elements of the final section.
    pub fn final_len(&self) -> usize {
        self.final_sizes.iter().sum()
    }
    /// Total f32 elements the buffer must hold.
    pub fn total_len(&self) -> usize {
        self.layers * self.per_layer() + self.final_len() + self.scratch_sizes.iter().sum::<usize>()
    }

    /// Splits the buffer into (layers section, final section, scratch section).
    pub fn sections<'a>(&self, buf: &'a mut [f32]) -> Result<[&'a mut [f32]; 3]> {
        carve(
            buf,
            [
                self.layers * self.per_layer(),
                self.final_len(),
                self.scratch_sizes.iter().sum(),
            ],
        )
    }
    /// Splits one layer section into its saved tensors.
    pub fn layer<'a>(&self, sec: &'a mut [f32]) -> Result<[&'a mut [f32]; LAYER_SLOTS]> {
        carve(sec, self.layer_sizes)
    }
    /// Splits the final section into `[x_final, rstd, normed, logits]`.
    pub fn final_parts<'a>(&self, sec: &'a mut [f32]) -> Result<[&'a mut [f32]; 4]> {
        carve(sec, self.final_sizes)
    }
    /// Splits the scratch section into
    /// `[d1, d2, tq, tk, tv, hq, hk, hv, f1, f2, f3, lora_r]`.
    pub fn scratch<'a>(&self, sec: &'a mut [f32]) -> Result<[&'a mut [f32]; SCRATCH_SLOTS]> {
        carve(sec, self.scratch_sizes)
    }
    /// Offset of the logits `[N, vocab]` (the head scratch in a [`training`](Self::training)
    /// layout) inside the whole buffer.
    pub fn logits_offset(&self) -> usize {
        self.layers * self.per_layer() + self.final_sizes[..3].iter().sum::<usize>()
    }
    /// Offset of the final normed hidden states `[N, d]` inside the whole buffer.
    pub fn hidden_offset(&self) -> usize {
        self.layers * self.per_layer() + self.final_sizes[..2].iter().sum::<usize>()
    }

    /// The chunked head's operands in a buffer laid out by `self`: `(hidden [N, d], head
    /// scratch, dh [N, d])` — the final normed hidden states, the final section's last slot,
    /// and the scratch slot [`crate::backward::backward_body`] reads `∂L/∂h` from.
    pub fn head_parts<'a>(
        &self,
        buf: &'a mut [f32],
    ) -> Result<(&'a [f32], &'a mut [f32], &'a mut [f32])> {
        let [_, fin, scratch] = self.sections(buf)?;
        let [_, _, hidden, head] = self.final_parts(fin)?;
        let [_, dh, ..] = self.scratch(scratch)?;
        Ok((hidden, head, dh))
    }
}
