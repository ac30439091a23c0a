//! End to end on real files: `init` a tiny preset directory, load it back from disk with its
//! tokenizer, SFT it on text, and generate — the generated text follows the trained pattern.
#![allow(clippy::unwrap_used)]

use crate::common;

use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::ModelConfig;
use tandem_native_core::engine::{Engine, EngineConfig, GenRequest};
use tandem_native_core::init::{Preset, init_preset};
use tandem_native_core::loss::Loss;
use tandem_native_core::model::Model;
use tandem_native_core::sampling::SamplingParams;
use tandem_native_core::tokenizer;
use tandem_native_core::trainer::Batch;

#[test]
fn init_load_sft_generate_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = VecProvider::new();
    init_preset(Preset::Tiny, dir.path(), 3, &mut p).unwrap();
    // Shrink for a debug-build test: keep the files' layout, use a smaller model config.
    let mut cfg = ModelConfig::from_dir(dir.path()).unwrap();
    cfg.hidden_size = 64;
    cfg.intermediate_size = 128;
    cfg.num_hidden_layers = 2;
    cfg.head_dim = 16;
    let mut small = Model::new_zeroed(cfg, &mut p).unwrap();
    small.init_random(4, 0.02);
    small.save(dir.path()).unwrap();
    let model = Model::load(dir.path(), &mut p).unwrap();
    let tk = tokenizer::load(dir.path()).unwrap();
    let text = "Q: 12+7=? A: 19";
    let ids = tokenizer::encode(&tk, text).unwrap();
    let t = ids.len();
    let prompt_len = tokenizer::encode(&tk, "Q: 12+7=? A:").unwrap().len();
    let mask: Vec<f32> = (0..t)
        .map(|j| if j >= prompt_len { 1.0 } else { 0.0 })
        .collect();
    let mut tr = common::trainer(model, None, 1e-2, &mut p);
    let batch = Batch {
        tokens: &ids,
        b: 1,
        t,
        mask: &mask,
    };
    for _ in 0..40 {
        tr.train_step(&batch, &Loss::Sft, &mut p).unwrap();
    }
    let out_dir = dir.path().join("sft");
    tr.model.save(&out_dir).unwrap();
    let model = Model::load(&out_dir, &mut p).unwrap();
    let mut e = Engine::new(
        model,
        EngineConfig {
            max_batch: 2,
            max_seq: 64,
        },
        &mut p,
    )
    .unwrap();
    let req = GenRequest {
        prompt: ids[..prompt_len].to_vec(),
        max_tokens: t - prompt_len,
        stop_tokens: vec![2],
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        adapter: None,
    };
    let out = e
        .generate(std::slice::from_ref(&req), false, &mut p)
        .unwrap();
    let completion = tokenizer::decode(&tk, &out[0].tokens).unwrap();
    assert_eq!(completion.trim(), "19", "generated {completion:?}");
    // Flushing (or discarding) the KV cache between calls does not change seeded output.
    e.kv_cache().as_mut_slice().fill(f32::NAN);
    let again = e.generate(&[req], false, &mut p).unwrap();
    assert_eq!(again[0].tokens, out[0].tokens);
}
