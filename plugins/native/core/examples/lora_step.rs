//! Times one training step of SmolLM2-135M's shape (random init) at the RL bench's sequence
//! shape, full fine-tuning vs LoRA r16/α32 on every projection: `cargo run --release
//! --example lora_step -p tandem-native-core -- [full|lora|both] [sequences] [steps]`.
//! A profiling aid (run it under `perf record`), not a benchmark of record.

use std::time::Instant;

use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::{Arch, ModelConfig};
use tandem_native_core::lora::{ALL_TARGETS, LoraAdapter, LoraConfig};
use tandem_native_core::loss::Loss;
use tandem_native_core::model::Model;
use tandem_native_core::optim::AdamW;
use tandem_native_core::trainer::{Batch, MicroBatch, Trainer};

fn smollm2() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab_size: 49152,
        hidden_size: 576,
        intermediate_size: 1536,
        num_hidden_layers: 30,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 100000.0,
        max_position_embeddings: 2048,
        tie_word_embeddings: true,
        qkv_bias: false,
        o_bias: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
    }
}

fn run(lora: bool, b: usize, steps: usize) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = smollm2();
    let mut p = VecProvider::new();
    let mut model = Model::new_zeroed(cfg.clone(), &mut p)?;
    model.init_random(1, 0.02);
    let ad = if lora {
        let lc = LoraConfig {
            r: 16,
            alpha: 32.0,
            targets: ALL_TARGETS.to_vec(),
            base_model: String::new(),
        };
        let mut ad = LoraAdapter::new(&cfg, lc, &mut p)?;
        ad.init_a(3);
        Some(ad)
    } else {
        None
    };
    let mut tr = Trainer::new(model, ad, AdamW::default(), &mut p)?;
    tr.micro_batch = MicroBatch {
        tokens: usize::MAX,
        sequences: 4,
    };
    // 56..=64 prompt + 48 completion tokens, right-padded to 112.
    let t = 112;
    let mut tokens = vec![0u32; b * t];
    let mut mask = vec![0f32; b * t];
    for s in 0..b {
        let pl = 56 + (s / 8 * 5) % 9;
        for j in 0..pl + 48 {
            tokens[s * t + j] = ((s * 1000 + j) * 7919 % cfg.vocab_size) as u32;
            if j >= pl {
                mask[s * t + j] = 1.0;
            }
        }
    }
    let batch = Batch {
        tokens: &tokens,
        b,
        t,
        mask: &mask,
    };
    for i in 0..=steps {
        let t0 = Instant::now();
        let (ls, st) = tr.train_step(&batch, &Loss::Sft, &mut p)?;
        println!(
            "{} step {i}: {:.2} s (loss {:.4}, grad norm {:.4})",
            if lora { "lora" } else { "full" },
            t0.elapsed().as_secs_f64(),
            ls.loss,
            st.grad_norm
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map(String::as_str).unwrap_or("both");
    let b = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16);
    let steps = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    if which != "lora" {
        run(false, b, steps)?;
    }
    if which != "full" {
        run(true, b, steps)?;
    }
    Ok(())
}
