//! Engine behaviour: KV-cache decode agrees with the full forward (scoring), batching and
//! seeds are deterministic, per-sequence LoRA adapters change exactly their sequences,
//! stop tokens and max_tokens end generation.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{random_model, seq};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::Arch;
use tandem_native_core::engine::{Engine, EngineConfig, FinishReason, GenRequest};
use tandem_native_core::lora::{LoraAdapter, LoraConfig, Target};
use tandem_native_core::sampling::SamplingParams;

fn cfg() -> tandem_native_core::config::ModelConfig {
    let mut c = common::tiny_cfg(Arch::Qwen2, true);
    c.vocab_size = 40;
    c
}

fn req(prompt: Vec<u32>, temp: f32, seed: u64, adapter: Option<&str>) -> GenRequest {
    GenRequest {
        prompt,
        max_tokens: 12,
        stop_tokens: vec![],
        sampling: SamplingParams {
            temperature: temp,
            top_p: 1.0,
            top_k: 0,
            seed,
        },
        adapter: adapter.map(String::from),
    }
}

fn engine(p: &mut VecProvider) -> Engine {
    let model = random_model(cfg(), 7, p);
    Engine::new(
        model,
        EngineConfig {
            max_batch: 4,
            max_seq: 32,
        },
        p,
    )
    .unwrap()
}

fn adapter(e: &Engine, p: &mut VecProvider) -> LoraAdapter {
    let lc = LoraConfig {
        r: 2,
        alpha: 8.0,
        targets: vec![Target::Q, Target::V, Target::O, Target::Down],
        base_model: "tiny".into(),
    };
    let mut ad = LoraAdapter::new(&e.model.cfg, lc, p).unwrap();
    let v = seq(ad.layout.total_len(), 0.5, 77);
    ad.weights.as_mut_slice().copy_from_slice(&v);
    ad
}

#[test]
fn decode_logprobs_match_full_forward_scoring() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p);
    let ad = adapter(&e, &mut p);
    e.add_adapter("a", ad, &mut p).unwrap();
    let reqs = vec![
        req(vec![1, 5, 9, 3], 1.0, 11, None),
        req(vec![4, 4, 2, 8, 19, 30, 7], 0.8, 12, Some("a")),
        req(vec![2], 0.0, 13, None),
    ];
    let outs = e.generate(&reqs, true, &mut p).unwrap();
    for (r, o) in reqs.iter().zip(&outs) {
        assert_eq!(o.tokens.len(), 12);
        assert_eq!(o.finish, FinishReason::Length);
        assert_eq!(o.hidden.as_ref().unwrap().len(), 12 * 16);
        let mut full = r.prompt.clone();
        full.extend(&o.tokens);
        let scored = e.score(&full, r.adapter.as_deref(), &mut p).unwrap();
        for (j, lp) in o.logprobs.iter().enumerate() {
            let s = scored[r.prompt.len() + j];
            assert!(
                (lp - s).abs() < 1e-4,
                "token {j}: decode logprob {lp} vs scored {s}"
            );
        }
    }
}

#[test]
fn seeds_and_batching_are_deterministic_and_adapters_are_per_sequence() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p);
    let ad = adapter(&e, &mut p);
    e.add_adapter("a", ad, &mut p).unwrap();
    let a = req(vec![3, 1, 4, 1, 5], 1.0, 42, None);
    let alone = e.generate(std::slice::from_ref(&a), false, &mut p).unwrap();
    // Same request inside a batch (5 requests > max_batch 4: two waves) gives the same tokens.
    let batch = vec![
        req(vec![9, 9], 1.0, 1, Some("a")),
        a.clone(),
        req(vec![2, 6], 0.0, 3, None),
        req(vec![7], 1.0, 4, Some("a")),
        a.clone(),
    ];
    let outs = e.generate(&batch, false, &mut p).unwrap();
    assert_eq!(outs[1].tokens, alone[0].tokens);
    assert_eq!(outs[4].tokens, alone[0].tokens);
    let other_seed = e
        .generate(&[req(vec![3, 1, 4, 1, 5], 1.0, 43, None)], false, &mut p)
        .unwrap();
    assert_ne!(
        other_seed[0].tokens, alone[0].tokens,
        "a different seed should sample differently"
    );
    // Greedy with and without the adapter differs; without it equals the base.
    let g = |ad: Option<&str>| req(vec![5, 6, 7], 0.0, 0, ad);
    let outs = e
        .generate(&[g(None), g(Some("a")), g(None)], false, &mut p)
        .unwrap();
    assert_eq!(outs[0].tokens, outs[2].tokens);
    assert_ne!(outs[0].logprobs, outs[1].logprobs);
    let err = e
        .generate(&[g(Some("missing"))], false, &mut p)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing") && err.contains("not loaded"),
        "{err}"
    );
}

#[test]
fn stop_tokens_and_limits_end_generation() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p);
    let base = e
        .generate(&[req(vec![1, 2, 3], 0.0, 0, None)], false, &mut p)
        .unwrap();
    let stop = base[0].tokens[3];
    let mut r = req(vec![1, 2, 3], 0.0, 0, None);
    r.stop_tokens = vec![stop];
    let out = e.generate(&[r], false, &mut p).unwrap();
    let first = base[0].tokens.iter().position(|&t| t == stop).unwrap();
    assert_eq!(out[0].tokens, base[0].tokens[..=first]);
    assert_eq!(out[0].finish, FinishReason::Stop);
    // Cache capacity bounds the length: prompt 30 + at most 1 new token in max_seq 32.
    let mut long = req((0..30).map(|i| i % 40).collect(), 0.0, 0, None);
    long.max_tokens = 100;
    let out = e.generate(&[long], false, &mut p).unwrap();
    assert!(out[0].tokens.len() <= 2);
    assert!(
        e.generate(&[req(vec![99], 0.0, 0, None)], false, &mut p)
            .is_err(),
        "out-of-vocab prompt must be rejected"
    );
    assert!(
        e.generate(&[req(vec![], 0.0, 0, None)], false, &mut p)
            .is_err()
    );
}

#[test]
fn inference_layout_matches_training_layout_and_cannot_backprop() {
    use tandem_native_core::acts::ActLayout;
    use tandem_native_core::backward::{Grads, backward};
    use tandem_native_core::forward::forward;
    let mut p = VecProvider::new();
    let model = random_model(cfg(), 8, &mut p);
    let toks = common::tokens(2 * 6, 40, 3);
    let run = |al: &ActLayout| {
        let mut acts = vec![0.0; al.total_len()];
        forward(&model, None, &toks, al, &mut acts, true).unwrap();
        let lo = al.logits_offset();
        (acts[lo..lo + 12 * 40].to_vec(), acts)
    };
    let train = ActLayout::new(&model.cfg, 2, 6, None);
    let inf = ActLayout::for_inference(&model.cfg, 2, 6, None);
    assert!(inf.total_len() < train.total_len());
    let (a, _) = run(&train);
    let (b, mut acts) = run(&inf);
    assert_eq!(a, b);
    let mut g = vec![0.0; model.layout.total_len()];
    let err = backward(
        &model,
        None,
        &toks,
        &inf,
        &mut acts,
        Grads {
            base: Some(&mut g),
            lora: None,
        },
    );
    assert!(
        err.unwrap_err()
            .to_string()
            .contains("training activation layout")
    );
}

#[test]
fn a_prefill_layout_holds_no_logits_and_the_same_hidden_states() {
    use tandem_native_core::acts::ActLayout;
    use tandem_native_core::forward::forward;
    let mut p = VecProvider::new();
    let model = random_model(cfg(), 8, &mut p);
    let toks = common::tokens(2 * 6, 40, 3);
    let inf = ActLayout::for_inference(&model.cfg, 2, 6, None);
    let pre = ActLayout::for_prefill(&model.cfg, 2, 6, None);
    // Exactly the logits `[N, vocab]` less.
    assert_eq!(pre.total_len() + 12 * 40, inf.total_len());
    let hidden = |al: &ActLayout| {
        let mut acts = vec![0.0; al.total_len()];
        forward(&model, None, &toks, al, &mut acts, false).unwrap();
        let ho = al.hidden_offset();
        acts[ho..ho + 12 * model.cfg.hidden_size].to_vec()
    };
    assert_eq!(hidden(&inf), hidden(&pre));
    let mut acts = vec![0.0; pre.total_len()];
    let err = forward(&model, None, &toks, &pre, &mut acts, true).unwrap_err();
    assert!(err.to_string().contains("holds no logits"), "{err}");
}

#[test]
fn continuous_batching_refills_slots_without_changing_outputs() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p);
    let ad = adapter(&e, &mut p);
    e.add_adapter("a", ad, &mut p).unwrap();
    // 9 requests with uneven lengths through 4 slots: slots are refilled mid-decode.
    let reqs: Vec<GenRequest> = (0..9)
        .map(|i| {
            let mut r = req(
                vec![1 + i as u32, 7, (3 * i % 40) as u32],
                1.0,
                100 + i as u64,
                (i % 3 == 0).then_some("a"),
            );
            r.max_tokens = 1 + (i * 5) % 12;
            r
        })
        .collect();
    let together = e.generate(&reqs, true, &mut p).unwrap();
    for (r, o) in reqs.iter().zip(&together) {
        let alone = e.generate(std::slice::from_ref(r), true, &mut p).unwrap();
        assert_eq!(o.tokens.len(), r.max_tokens);
        assert_eq!(o.tokens, alone[0].tokens);
        for (a, b) in o.logprobs.iter().zip(&alone[0].logprobs) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}

#[test]
fn padded_batched_prefill_matches_scoring() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p);
    // Same adapter, different prompt lengths: one right-padded prefill forward.
    let reqs = vec![
        req(vec![3, 9, 27, 1, 5], 1.0, 1, None),
        req(vec![8, 2], 1.0, 2, None),
        req(vec![1, 2, 3, 4, 5, 6, 7, 8, 9], 1.0, 3, None),
    ];
    let outs = e.generate(&reqs, true, &mut p).unwrap();
    for (r, o) in reqs.iter().zip(&outs) {
        let mut full = r.prompt.clone();
        full.extend(&o.tokens);
        let scored = e.score(&full, None, &mut p).unwrap();
        for (j, lp) in o.logprobs.iter().enumerate() {
            let s = scored[r.prompt.len() + j];
            assert!(
                (lp - s).abs() < 1e-4,
                "prompt len {}: token {j}: {lp} vs {s}",
                r.prompt.len()
            );
        }
        let alone = e.generate(std::slice::from_ref(r), false, &mut p).unwrap();
        assert_eq!(alone[0].tokens, o.tokens);
    }
}
