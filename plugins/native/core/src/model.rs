//! `Model`: config + parameter layout + the weights buffer (+ RoPE table); loading from and
//! saving to a Hugging Face directory, random initialisation.

use std::path::Path;

use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::config::ModelConfig;
use crate::error::{NativeError, Result};
use crate::layout::{ModelOffsets, ParamLayout};
use crate::ops::rope::RopeTable;
use crate::sampling::Rng;
use crate::st_io;

/// Longest RoPE table precomputed (positions beyond are rejected).
pub const MAX_ROPE_POSITIONS: usize = 8192;

/// A Llama-family model whose weights live in one provider buffer (tag `weights`).
pub struct Model {
    /// Architecture.
    pub cfg: ModelConfig,
    /// Hugging Face names -> offsets.
    pub layout: ParamLayout,
    /// Cached ranges for compute.
    pub offs: ModelOffsets,
    /// The weights.
    pub weights: Box<dyn Region>,
    /// Precomputed RoPE cos/sin.
    pub rope: RopeTable,
}

impl Model {
    /// A model with zeroed weights in a fresh `weights` buffer.
    pub fn new_zeroed(cfg: ModelConfig, provider: &mut dyn BufferProvider) -> Result<Self> {
        cfg.validate()?;
        let (layout, offs) = ParamLayout::for_model(&cfg);
        let weights = provider.alloc(BufferTag::Weights, "weights/base", layout.total_len())?;
        let rope = RopeTable::new(
            cfg.head_dim,
            cfg.rope_theta,
            cfg.max_position_embeddings.min(MAX_ROPE_POSITIONS),
        );
        Ok(Model {
            cfg,
            layout,
            offs,
            weights,
            rope,
        })
    }

    /// Loads `dir/config.json` and its safetensors (single or sharded) into a provider buffer.
    pub fn load(dir: &Path, provider: &mut dyn BufferProvider) -> Result<Self> {
        let cfg = ModelConfig::from_dir(dir)?;
        let files = st_io::model_files(dir)?;
        let mut m = Self::new_zeroed(cfg, provider)?;
        let tied = m.cfg.tie_word_embeddings;
        st_io::load_into(&files, &m.layout, m.weights.as_mut_slice(), &|n| {
            // A tied checkpoint may still carry lm_head.weight; the embedding is authoritative.
            if tied && n == "lm_head.weight" {
                None
            } else {
                Some(n.to_string())
            }
        })?;
        Ok(m)
    }

    /// Writes `config.json` and `model.safetensors` (f32) into `dir` (created if needed).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| NativeError::io(dir, e))?;
        self.cfg.save(dir)?;
        st_io::save_from(
            &dir.join("model.safetensors"),
            &self.layout,
            self.weights.as_slice(),
            &|n| n.to_string(),
        )
    }

    /// Random initialisation like transformers' `_init_weights`: normal(0, `std`) for
    /// matrices, ones for norms, zeros for biases.
    pub fn init_random(&mut self, seed: u64, std: f32) {
        let mut rng = Rng::new(seed);
        let w = self.weights.as_mut_slice();
        for e in self.layout.entries() {
            let r = e.range();
            if e.name.ends_with("norm.weight") {
                w[r].fill(1.0);
            } else if e.name.ends_with(".bias") {
                w[r].fill(0.0);
            } else {
                for x in &mut w[r] {
                    *x = rng.normal() * std;
                }
            }
        }
    }

    /// The weights as a slice.
    pub fn w(&self) -> &[f32] {
        self.weights.as_slice()
    }

    /// Read view of one parameter by Hugging Face name.
    pub fn tensor(&self, name: &str) -> Result<&[f32]> {
        let r = self.layout.require(name)?.range();
        Ok(&self.weights.as_slice()[r])
    }

    /// Write view of one parameter by Hugging Face name (weight updates by name, e.g. a
    /// bucketed broadcast). Writing `model.embed_tokens.weight` of a tied model also changes
    /// the lm_head (they are one tensor).
    pub fn tensor_mut(&mut self, name: &str) -> Result<&mut [f32]> {
        let r = self.layout.require(name)?.range();
        Ok(&mut self.weights.as_mut_slice()[r])
    }

    /// Replaces all weights with `src` (same layout, e.g. a trainer's weights buffer).
    pub fn copy_weights_from(&mut self, src: &[f32]) -> Result<()> {
        let dst = self.weights.as_mut_slice();
        if src.len() != self.layout.total_len() || dst.len() < src.len() {
            return Err(NativeError::Buffer(format!(
                "weight update of {} f32 does not match the layout's {}",
                src.len(),
                self.layout.total_len()
            )));
        }
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    /// Errors unless every token id is < vocab_size.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(NativeError::Input(format!(
                "token id {t} is out of range for vocab_size {}",
                self.cfg.vocab_size
            )));
        }
        Ok(())
    }
}
