//! EAGLE-3 drafter: a one-layer Llama decoder that predicts the target's next tokens from
//! three of the target's residual streams, trained with the training-time test (TTT) and run
//! as the [`crate::engine::draft::DraftModel`] of speculative decoding.
//!
//! ## Checkpoint format
//!
//! Followed from vLLM `vllm/model_executor/models/llama_eagle3.py` (`Eagle3LlamaForCausalLM`,
//! its `LlamaModel.load_weights`: `midlayer.` → `layers.0.`, every name but `lm_head` gets a
//! `model.` prefix, `d2t` → `draft_id_to_target_id`, `t2d` skipped, `embed_tokens` loaded when
//! present), vLLM `vllm/v1/worker/gpu_model_runner.py` (`_get_eagle3_aux_layers_from_config`:
//! `eagle_aux_hidden_state_layer_ids` at the top level, older releases under `eagle_config`),
//! vLLM `vllm/model_executor/models/llama.py` (`get_eagle3_aux_hidden_state_layers` =
//! `(2, L/2, L-3)`; layer `i`'s aux feature is `hidden_states + residual` ENTERING layer `i`),
//! and SGLang `python/sglang/srt/models/llama_eagle3.py` (`LlamaForCausalLMEagle3`:
//! `model.midlayer`, `model.fc` sized `3 · target_hidden_size`, `draft_vocab_size`,
//! `hot_token_id = d2t + arange`, `t2d` skipped, `bias` for fc).
//!
//! `config.json`: `architectures: ["LlamaForCausalLMEagle3"]`, `model_type: "llama"`,
//! `num_hidden_layers: 1`, `hidden_size`, `intermediate_size`, `num_attention_heads`,
//! `num_key_value_heads`, `head_dim`, `hidden_act: "silu"`, `rms_norm_eps`, `rope_theta`,
//! `max_position_embeddings`, `vocab_size` (the target's), `draft_vocab_size`,
//! `target_hidden_size`, `tie_word_embeddings: false`, `attention_bias: false`,
//! `norm_before_residual: false`, `eagle_aux_hidden_state_layer_ids` (also under
//! `eagle_config`, with `use_aux_hidden_state: true`).
//!
//! `model.safetensors` (f32 parameters; BF16/F16 also load):
//!
//! | name | shape |
//! |---|---|
//! | `fc.weight` | `[H, 3·H_target]` |
//! | `midlayer.input_layernorm.weight` | `[H]` (normalises the token embedding) |
//! | `midlayer.hidden_norm.weight` | `[H]` (normalises the hidden input) |
//! | `midlayer.self_attn.{q,k,v}_proj.weight` | `[heads·hd or kv·hd, 2H]` (input `[embed ‖ hidden]`) |
//! | `midlayer.self_attn.o_proj.weight` | `[H, heads·hd]` |
//! | `midlayer.post_attention_layernorm.weight` | `[H]` |
//! | `midlayer.mlp.{gate,up}_proj.weight`, `down_proj.weight` | `[F, H]`, `[H, F]` |
//! | `norm.weight` | `[H]` |
//! | `lm_head.weight` | `[draft_vocab, H]` |
//! | `embed_tokens.weight` | `[vocab, H]` (the target's embedding, frozen) |
//! | `d2t` | I64 `[draft_vocab]`: target id = draft id + `d2t[draft id]` |
//! | `t2d` | BOOL `[vocab]`: target id is in the draft vocabulary |
//!
//! `d2t` / `t2d` are written only when `draft_vocab_size < vocab_size`: with the full
//! vocabulary vLLM's `Eagle3LlamaForCausalLM` has no `draft_id_to_target_id` parameter and
//! refuses the checkpoint if `d2t` is present (`app/tests/real/vllm_eagle3`); a missing `d2t`
//! loads as the identity.
//!
//! ## Storage
//!
//! All f32 parameters live in one `weights/drafter` buffer ([`layout`]): the trainable ones
//! first, the frozen `embed_tokens` LAST, so the trainable parameters are the prefix
//! `0..trainable_len()` and gradients / AdamW moments are sized to that prefix only. The
//! `d2t` / `t2d` maps are small host vectors.
//!
//! ## Aux layers
//!
//! [`default_aux_layers`]: vLLM's `(2, L/2, L−3)` when those are distinct and below `L`,
//! otherwise `(min(1, L−1), L/2, L−1)` (all below `L`, so vLLM and SGLang can capture them).
//! Id `L` would be the final residual before the final norm ([`aux_features`] computes it),
//! but vLLM captures only layer inputs, so [`Drafter::check_target`] requires ids `< L`.

mod attn;
mod backward;
pub mod config;
mod features;
mod forward;
mod head;
mod io;
pub mod layout;
mod plan;
mod runner;
mod runner_step;
mod trainer;

pub use config::DrafterConfig;
pub use features::aux_features;
pub use layout::DrafterOffsets;
pub use runner::{DrafterRunner, RunnerConfig};
pub use trainer::{DrafterStepMetrics, DrafterTrainer, SeqFeatures, TttConfig};

use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::config::ModelConfig;
use crate::error::{NativeError, Result};
use crate::layout::ParamLayout;
use crate::model::{MAX_ROPE_POSITIONS, Model};
use crate::ops::rope::RopeTable;
use crate::sampling::Rng;

/// Marks a target id outside the draft vocabulary in [`Drafter::target_to_draft`].
pub const NOT_DRAFTED: u32 = u32::MAX;

/// Options of [`Drafter::init_from_target`].
#[derive(Debug, Clone, Default)]
pub struct DrafterInit {
    /// Aux layer ids; `None` = [`default_aux_layers`] of the target.
    pub aux_layers: Option<[usize; 3]>,
    /// Target ids kept in the draft vocabulary (any order, sorted on use); `None` = all.
    pub draft_vocab: Option<Vec<u32>>,
    /// Seed of the random initialisation.
    pub seed: u64,
}

/// An EAGLE-3 drafter: config, parameter layout and the `weights/drafter` buffer, plus the
/// vocabulary maps and the RoPE table.
pub struct Drafter {
    /// Architecture.
    pub cfg: DrafterConfig,
    /// Tensor names (checkpoint names) → offsets; the embedding is the last entry.
    pub layout: ParamLayout,
    /// Cached ranges.
    pub offs: DrafterOffsets,
    /// All f32 parameters.
    pub weights: Box<dyn Region>,
    /// Precomputed RoPE cos/sin.
    pub rope: RopeTable,
    d2t: Vec<i64>,
    t2d: Vec<bool>,
    target_to_draft: Vec<u32>,
}

/// Default aux layer ids of a target with `num_layers` layers (see the module doc).
pub fn default_aux_layers(num_layers: usize) -> [usize; 3] {
    let l = num_layers;
    if l >= 3 && 2 < l / 2 && l / 2 < l - 3 {
        return [2, l / 2, l - 3];
    }
    let last = l.saturating_sub(1);
    [1.min(last), (l / 2).min(last), last]
}

/// The `size` most frequent token ids of `counts` (ties broken by the smaller id), returned
/// in increasing id order (the order EAGLE-3's `d2t` uses).
pub fn select_draft_vocab(counts: &[u64], size: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..counts.len() as u32).collect();
    ids.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(a.cmp(&b)));
    ids.truncate(size);
    ids.sort_unstable();
    ids
}

impl Drafter {
    /// A drafter with zeroed weights whose draft vocabulary is `draft_vocab` (target ids,
    /// distinct, any order: sorted here; its length must be `cfg.draft_vocab_size`).
    pub fn new_zeroed(
        cfg: DrafterConfig,
        draft_vocab: &[u32],
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        let mut kept = draft_vocab.to_vec();
        kept.sort_unstable();
        let d2t: Vec<i64> = kept
            .iter()
            .enumerate()
            .map(|(i, &t)| t as i64 - i as i64)
            .collect();
        Self::with_d2t(cfg, d2t, provider).map_err(|e| match e {
            NativeError::Param(m) => NativeError::Input(format!("draft vocabulary: {m}")),
            other => other,
        })
    }

    /// A drafter with zeroed weights and the given `d2t` offsets (checked: `t2d` and the
    /// inverse map are derived from it).
    pub(crate) fn with_d2t(
        cfg: DrafterConfig,
        d2t: Vec<i64>,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        cfg.validate().map_err(NativeError::Config)?;
        let (t2d, target_to_draft) = io::check_maps(&cfg, &d2t).map_err(NativeError::Param)?;
        let (layout, offs) = layout::drafter_layout(&cfg);
        let weights = provider.alloc(BufferTag::Weights, "weights/drafter", layout.total_len())?;
        let rope = RopeTable::new(
            cfg.head_dim,
            cfg.rope_theta,
            cfg.max_position_embeddings.min(MAX_ROPE_POSITIONS),
        );
        Ok(Drafter {
            cfg,
            layout,
            offs,
            weights,
            rope,
            d2t,
            t2d,
            target_to_draft,
        })
    }

    /// A fresh drafter for `target`: same width, heads and MLP width; the target's embedding
    /// (frozen), its final norm as `norm` and its lm_head rows of the kept tokens as
    /// `lm_head` (a warm start); every other matrix normal(0, 0.02), norms 1.
    pub fn init_from_target(
        target: &Model,
        opts: DrafterInit,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        let t = &target.cfg;
        let kept: Vec<u32> = match opts.draft_vocab {
            Some(v) => v,
            None => (0..t.vocab_size as u32).collect(),
        };
        let cfg = DrafterConfig {
            hidden_size: t.hidden_size,
            intermediate_size: t.intermediate_size,
            num_attention_heads: t.num_attention_heads,
            num_key_value_heads: t.num_key_value_heads,
            head_dim: t.head_dim,
            rms_norm_eps: t.rms_norm_eps,
            rope_theta: t.rope_theta,
            max_position_embeddings: t.max_position_embeddings,
            vocab_size: t.vocab_size,
            draft_vocab_size: kept.len(),
            target_hidden_size: t.hidden_size,
            aux_layers: opts
                .aux_layers
                .unwrap_or_else(|| default_aux_layers(t.num_hidden_layers)),
        };
        let mut d = Self::new_zeroed(cfg, &kept, provider)?;
        d.check_target(t)?;
        let mut rng = Rng::new(opts.seed);
        let h = d.cfg.hidden_size;
        let tw = target.w();
        let o = d.offs.clone();
        let tids: Vec<usize> = (0..d.cfg.draft_vocab_size)
            .map(|i| d.draft_to_target(i))
            .collect();
        let w = d.weights.as_mut_slice();
        for e in d.layout.entries() {
            let r = e.range();
            if e.name.ends_with("norm.weight") {
                w[r].fill(1.0);
            } else if r != o.embed && r != o.lm_head {
                w[r].iter_mut().for_each(|x| *x = rng.normal() * 0.02);
            }
        }
        w[o.embed.clone()].copy_from_slice(&tw[target.offs.embed.clone()]);
        w[o.norm.clone()].copy_from_slice(&tw[target.offs.norm.clone()]);
        let lm = &tw[target.offs.lm_head.clone()];
        for (row, &tid) in w[o.lm_head].chunks_exact_mut(h).zip(&tids) {
            row.copy_from_slice(&lm[tid * h..(tid + 1) * h]);
        }
        Ok(d)
    }

    /// Errors unless the drafter fits `target`: the features' width, the vocabulary and the
    /// aux layer ids (each below the target's layer count).
    pub fn check_target(&self, target: &ModelConfig) -> Result<()> {
        self.cfg.check_target(target)
    }

    /// Reads the drafter in `dir` (same configuration and vocabulary maps, checked first) into
    /// this drafter's buffer, allocating nothing. A failure half-way leaves this drafter's
    /// weights a mix: load into a spare and swap it in on success (what an engine does on
    /// `load_drafter`), or use [`reload`](Self::reload).
    pub fn load_into(&mut self, dir: &std::path::Path) -> Result<()> {
        io::load_into(dir, self)
    }

    /// Reads the drafter in `dir` into this drafter's buffer, all or nothing: the directory
    /// is loaded and checked completely (into a temporary heap buffer) before a value here
    /// changes, and must have this drafter's configuration and vocabulary maps.
    pub fn reload(&mut self, dir: &std::path::Path) -> Result<()> {
        let fresh = io::load(dir, None, &mut crate::buffer::VecProvider::new())?;
        if fresh.cfg != self.cfg {
            return Err(NativeError::Config(format!(
                "drafter {}: its configuration differs from the loaded drafter's; load it as a \
                 new drafter",
                dir.display()
            )));
        }
        if fresh.d2t != self.d2t {
            return Err(NativeError::Config(format!(
                "drafter {}: its draft vocabulary differs from the loaded drafter's",
                dir.display()
            )));
        }
        let n = self.layout.total_len();
        self.weights.as_mut_slice()[..n].copy_from_slice(&fresh.w()[..n]);
        Ok(())
    }

    /// A copy in a fresh `weights/drafter` buffer (e.g. a runner's copy of a trained drafter).
    pub fn try_clone(&self, provider: &mut dyn BufferProvider) -> Result<Self> {
        let mut d = Self::with_d2t(self.cfg.clone(), self.d2t.clone(), provider)?;
        d.weights
            .as_mut_slice()
            .copy_from_slice(&self.w()[..self.layout.total_len()]);
        Ok(d)
    }

    /// The weights as a slice.
    pub fn w(&self) -> &[f32] {
        self.weights.as_slice()
    }

    /// Read view of one tensor by checkpoint name.
    pub fn tensor(&self, name: &str) -> Result<&[f32]> {
        let r = self.layout.require(name)?.range();
        Ok(&self.weights.as_slice()[r])
    }

    /// Write view of one tensor by checkpoint name.
    pub fn tensor_mut(&mut self, name: &str) -> Result<&mut [f32]> {
        let r = self.layout.require(name)?.range();
        Ok(&mut self.weights.as_mut_slice()[r])
    }

    /// Length of the trainable prefix of the weights buffer (everything but the embedding).
    pub fn trainable_len(&self) -> usize {
        self.offs.embed.start
    }

    /// The aux layer ids, in feature order.
    pub fn aux_layers(&self) -> [usize; 3] {
        self.cfg.aux_layers
    }

    /// `d2t` offsets (`[draft_vocab]`).
    pub fn d2t(&self) -> &[i64] {
        &self.d2t
    }

    /// `t2d` membership (`[vocab]`).
    pub fn t2d(&self) -> &[bool] {
        &self.t2d
    }

    /// The target id of draft id `i`.
    pub fn draft_to_target(&self, i: usize) -> usize {
        (i as i64 + self.d2t[i]) as usize
    }

    /// The draft id of target id `t`, or [`NOT_DRAFTED`].
    pub fn target_to_draft(&self, t: usize) -> u32 {
        self.target_to_draft.get(t).copied().unwrap_or(NOT_DRAFTED)
    }

    /// Writes `config.json` and `model.safetensors` (f32 parameters, I64 `d2t`, BOOL `t2d`)
    /// atomically: into a sibling temp directory, fsynced, then renamed over `dir`.
    pub fn save(&self, dir: &std::path::Path) -> Result<()> {
        io::save(self, dir)
    }

    /// Loads a drafter directory (`config.json` + `model.safetensors`, or shards). With
    /// `target`: missing aux layer ids default to the target's, a missing `embed_tokens` is
    /// copied from it, and [`check_target`](Self::check_target) runs. Every problem is one
    /// error naming the file.
    pub fn load(
        dir: &std::path::Path,
        target: Option<&Model>,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        io::load(dir, target, provider)
    }
}
