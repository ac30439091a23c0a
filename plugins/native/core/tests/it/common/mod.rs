//! Shared helpers of the integration tests: tiny configs and deterministic values.
#![allow(dead_code)]

pub mod drafters;

use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::{Arch, ModelConfig};
use tandem_native_core::lora::LoraAdapter;
use tandem_native_core::model::Model;
use tandem_native_core::optim::AdamW;
use tandem_native_core::trainer::Trainer;

/// A very small config (fast in debug builds).
pub fn tiny_cfg(arch: Arch, tie: bool) -> ModelConfig {
    ModelConfig {
        arch,
        vocab_size: 13,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 4,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: tie,
        qkv_bias: arch == Arch::Qwen2,
        o_bias: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
    }
}

/// A model with random weights (biases and norms randomised too, so their grads matter).
pub fn random_model(cfg: ModelConfig, seed: u64, p: &mut VecProvider) -> Model {
    let mut m = Model::new_zeroed(cfg, p).unwrap();
    m.init_random(seed, 0.3);
    let vals = seq(m.layout.total_len(), 0.2, seed + 99);
    let entries = m.layout.entries().to_vec();
    let w = m.weights.as_mut_slice();
    for e in entries {
        if e.name.ends_with("norm.weight") || e.name.ends_with(".bias") {
            for i in e.range() {
                w[i] += vals[i];
            }
        }
    }
    m
}

/// Deterministic pseudo-random values in `[-scale, scale]`.
pub fn seq(n: usize, scale: f32, salt: u64) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Deterministic token ids below `vocab`.
pub fn tokens(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    seq(n, 1.0, salt)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * vocab as f32) as usize).min(vocab - 1) as u32)
        .collect()
}

/// A trainer of `model` (and `lora`) under AdamW at learning rate `lr`, no weight decay.
pub fn trainer(model: Model, lora: Option<LoraAdapter>, lr: f32, p: &mut VecProvider) -> Trainer {
    let opt = AdamW {
        lr,
        weight_decay: 0.0,
        ..Default::default()
    };
    Trainer::new(model, lora, opt, p).unwrap()
}
