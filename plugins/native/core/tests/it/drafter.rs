//! EAGLE-3 drafter: checkpoint round trip and load errors, target checks, vocabulary and aux
//! layer selection, aux features, warm-up, and training on a tiny target's own greedy
//! continuations (loss falls, accuracy rises).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{random_model, seq, tokens};
use tandem_native_core::buffer::{BufferTag, VecProvider};
use tandem_native_core::config::{Arch, ModelConfig};
use tandem_native_core::drafter::{
    Drafter, DrafterInit, DrafterTrainer, SeqFeatures, TttConfig, aux_features, default_aux_layers,
    select_draft_vocab,
};
use tandem_native_core::engine::{Engine, EngineConfig, GenRequest};
use tandem_native_core::model::Model;
use tandem_native_core::optim::AdamW;
use tandem_native_core::sampling::SamplingParams;

fn target_cfg() -> ModelConfig {
    let mut c = common::tiny_cfg(Arch::Llama, false);
    c.vocab_size = 40;
    c.num_hidden_layers = 4;
    c
}

fn target(p: &mut VecProvider) -> Model {
    random_model(target_cfg(), 11, p)
}

fn drafter(t: &Model, p: &mut VecProvider) -> Drafter {
    let init = DrafterInit {
        aux_layers: None,
        draft_vocab: Some((0..40).filter(|i| i % 3 != 1).collect()),
        seed: 4,
    };
    Drafter::init_from_target(t, init, p).unwrap()
}

fn err_text<T>(r: tandem_native_core::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn init_copies_the_target_and_checks_fit() {
    let mut p = VecProvider::new();
    let t = target(&mut p);
    let d = drafter(&t, &mut p);
    assert_eq!(d.aux_layers(), default_aux_layers(4));
    assert_eq!(d.aux_layers(), [1, 2, 3]);
    assert_eq!(d.cfg.draft_vocab_size, 27);
    assert_eq!(
        d.tensor("embed_tokens.weight").unwrap(),
        t.tensor("model.embed_tokens.weight").unwrap()
    );
    assert_eq!(
        d.tensor("norm.weight").unwrap(),
        t.tensor("model.norm.weight").unwrap()
    );
    let (lm, tlm) = (
        d.tensor("lm_head.weight").unwrap(),
        t.tensor("lm_head.weight").unwrap(),
    );
    for i in 0..27 {
        let tid = d.draft_to_target(i);
        assert_eq!(tid as i64, i as i64 + d.d2t()[i]);
        assert!(d.t2d()[tid] && tid % 3 != 1);
        assert_eq!(d.target_to_draft(tid), i as u32);
        assert_eq!(&lm[i * 16..(i + 1) * 16], &tlm[tid * 16..(tid + 1) * 16]);
    }
    assert_eq!(d.target_to_draft(1), u32::MAX);
    // The embedding is the last tensor: the trainable parameters are one prefix.
    assert_eq!(d.trainable_len(), d.offs.embed.start);
    let mut wrong = target_cfg();
    wrong.hidden_size = 32;
    assert!(err_text(d.check_target(&wrong)).contains("hidden size 16"));
    let mut wrong = target_cfg();
    wrong.vocab_size = 41;
    assert!(err_text(d.check_target(&wrong)).contains("vocab_size 40"));
    let mut wrong = target_cfg();
    wrong.num_hidden_layers = 3;
    let e = err_text(d.check_target(&wrong));
    assert!(e.contains("aux layer id 3") && e.contains("< 3"), "{e}");
    let init = DrafterInit {
        aux_layers: Some([0, 2, 4]),
        ..Default::default()
    };
    let e = err_text(Drafter::init_from_target(&t, init, &mut p));
    assert!(e.contains("aux layer id 4"), "{e}");
    let init = DrafterInit {
        draft_vocab: Some(vec![3, 3]),
        ..Default::default()
    };
    assert!(err_text(Drafter::init_from_target(&t, init, &mut p)).contains("appears twice"));
}

#[test]
fn aux_layer_defaults_and_draft_vocab_selection() {
    assert_eq!(default_aux_layers(32), [2, 16, 29]);
    assert_eq!(default_aux_layers(30), [2, 15, 27]);
    assert_eq!(default_aux_layers(7), [2, 3, 4]);
    assert_eq!(default_aux_layers(6), [1, 3, 5]);
    assert_eq!(default_aux_layers(2), [1, 1, 1]);
    assert_eq!(default_aux_layers(1), [0, 0, 0]);
    let counts = [5, 0, 9, 5, 7, 5, 1];
    assert_eq!(select_draft_vocab(&counts, 3), vec![0, 2, 4]);
    assert_eq!(select_draft_vocab(&counts, 4), vec![0, 2, 3, 4]);
    assert_eq!(select_draft_vocab(&counts, 99).len(), 7);
}

#[test]
fn config_keys_follow_vllm_and_sglang() {
    use tandem_native_core::drafter::DrafterConfig;
    let path = std::path::Path::new("x/config.json");
    let mut v = serde_json::json!({
        "architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama",
        "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "draft_vocab_size": 64, "target_hidden_size": 32, "rms_norm_eps": 1e-5,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]},
    });
    let c = DrafterConfig::from_json(&v, path, None).unwrap();
    assert_eq!(
        (c.aux_layers, c.head_dim, c.feat_dim()),
        ([1, 5, 9], 16, 96)
    );
    assert_eq!(c.rope_theta, 10000.0);
    // The top-level key wins; a target's defaults fill in when both are absent.
    v["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([2, 3, 4]);
    assert_eq!(
        DrafterConfig::from_json(&v, path, None).unwrap().aux_layers,
        [2, 3, 4]
    );
    let m = v.as_object_mut().unwrap();
    m.remove("eagle_aux_hidden_state_layer_ids");
    m.remove("eagle_config");
    assert_eq!(
        DrafterConfig::from_json(&v, path, Some([0, 1, 2]))
            .unwrap()
            .aux_layers,
        [0, 1, 2]
    );
    let round = DrafterConfig::from_json(&c.to_json(), path, None).unwrap();
    assert_eq!(round, c);
    for (key, val, msg) in [
        (
            "tie_word_embeddings",
            serde_json::json!(true),
            "tie_word_embeddings",
        ),
        (
            "norm_before_residual",
            serde_json::json!(true),
            "norm_before_residual",
        ),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "llama3"}),
            "rope scaling",
        ),
        (
            "architectures",
            serde_json::json!(["LlamaForCausalLM"]),
            "not an EAGLE-3",
        ),
        (
            "eagle_aux_hidden_state_layer_ids",
            serde_json::json!([1, 2]),
            "exactly three",
        ),
        (
            "draft_vocab_size",
            serde_json::json!(300),
            "exceeds vocab_size",
        ),
    ] {
        let mut bad = c.to_json();
        bad[key] = val;
        let e = err_text(DrafterConfig::from_json(&bad, path, None));
        assert!(e.contains(msg) && e.contains("x/config.json"), "{key}: {e}");
    }
}

#[test]
fn aux_features_are_the_residual_streams() {
    let mut p = VecProvider::new();
    let t = target(&mut p);
    let toks = tokens(6, 40, 9);
    let f = aux_features(&t, &toks, &[0, 4, 2]).unwrap();
    assert_eq!(f.len(), 6 * 3 * 16);
    let emb = t.tensor("model.embed_tokens.weight").unwrap();
    for (i, &x) in toks.iter().enumerate() {
        let x = x as usize;
        assert_eq!(&f[i * 48..i * 48 + 16], &emb[x * 16..(x + 1) * 16]);
    }
    // Layer 4 of 4 = the final residual: final norm + lm_head of it are the target's logits.
    let al = tandem_native_core::acts::ActLayout::new(&t.cfg, 1, 6, None);
    let mut acts = vec![0.0; al.total_len()];
    tandem_native_core::forward::forward(&t, None, &toks, &al, &mut acts, true).unwrap();
    let (wn, lm) = (
        t.tensor("model.norm.weight").unwrap(),
        t.tensor("lm_head.weight").unwrap(),
    );
    for i in 0..6 {
        let x = &f[i * 48 + 16..i * 48 + 32];
        let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / 16.0 + 1e-5).sqrt();
        for v in 0..40 {
            let lg: f32 = (0..16).map(|j| x[j] * inv * wn[j] * lm[v * 16 + j]).sum();
            let want = acts[al.logits_offset() + i * 40 + v];
            assert!((lg - want).abs() < 1e-4, "{lg} vs {want}");
        }
    }
    let e = aux_features(&t, &toks, &[5]);
    assert!(err_text(e).contains("out of range"));
}

/// A full-vocabulary drafter is saved without `d2t` / `t2d` (vLLM refuses `d2t` there) and
/// loads back with the identity map.
#[test]
fn full_vocab_checkpoint_has_no_maps() {
    let mut p = VecProvider::new();
    let t = target(&mut p);
    let d = Drafter::init_from_target(&t, DrafterInit::default(), &mut p).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full");
    d.save(&dir).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(st.tensor("d2t").is_err() && st.tensor("t2d").is_err());
    let l = Drafter::load(&dir, Some(&t), &mut p).unwrap();
    assert!(l.d2t().iter().all(|&o| o == 0) && l.t2d().iter().all(|&b| b));
    assert_eq!(l.target_to_draft(17), 17);
}

#[test]
fn checkpoint_round_trips_bit_exact_and_bad_files_are_errors() {
    let mut p = VecProvider::new();
    let t = target(&mut p);
    let mut d = drafter(&t, &mut p);
    let n = d.layout.total_len();
    let noise = seq(n, 1.0, 5);
    d.weights.as_mut_slice().copy_from_slice(&noise);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("drafter");
    d.save(&dir).unwrap();
    d.save(&dir).unwrap(); // replaces atomically
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["architectures"][0], "LlamaForCausalLMEagle3");
    assert_eq!(cfg["draft_vocab_size"], 27);
    assert_eq!(
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        serde_json::json!([1, 2, 3])
    );
    let l = Drafter::load(&dir, None, &mut p).unwrap();
    assert_eq!(l.cfg, d.cfg);
    assert_eq!(l.d2t(), d.d2t());
    assert_eq!(l.t2d(), d.t2d());
    let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(l.w()), bits(d.w()));
    // The file holds I64 d2t and BOOL t2d beside the f32 tensors.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("d2t").unwrap().dtype(), safetensors::Dtype::I64);
    assert_eq!(st.tensor("t2d").unwrap().dtype(), safetensors::Dtype::BOOL);
    assert_eq!(st.tensor("fc.weight").unwrap().shape(), &[16, 48]);
    assert_eq!(
        st.tensor("midlayer.self_attn.q_proj.weight")
            .unwrap()
            .shape(),
        &[16, 32]
    );

    // Truncated file.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(dir.join("config.json"), bad.join("config.json")).unwrap();
    std::fs::write(bad.join("model.safetensors"), &bytes[..bytes.len() - 10]).unwrap();
    let e = err_text(Drafter::load(&bad, None, &mut p));
    assert!(
        e.contains("model.safetensors") && e.contains("truncated"),
        "{e}"
    );
    // Garbage header.
    let mut junk = bytes.clone();
    junk[12] = b'#';
    std::fs::write(bad.join("model.safetensors"), &junk).unwrap();
    assert!(err_text(Drafter::load(&bad, None, &mut p)).contains("invalid header"));
    std::fs::write(bad.join("model.safetensors"), [1u8, 2, 3]).unwrap();
    assert!(err_text(Drafter::load(&bad, None, &mut p)).contains("not a safetensors file"));
    // Wrong hidden size in the config: shapes no longer match.
    std::fs::write(bad.join("model.safetensors"), &bytes).unwrap();
    let mut c2 = cfg.clone();
    c2["intermediate_size"] = serde_json::json!(20);
    std::fs::write(bad.join("config.json"), c2.to_string()).unwrap();
    let e = err_text(Drafter::load(&bad, None, &mut p));
    assert!(
        e.contains("mlp.gate_proj.weight") && e.contains("shape"),
        "{e}"
    );
    // d2t that disagrees with draft_vocab_size.
    let mut c2 = cfg.clone();
    c2["draft_vocab_size"] = serde_json::json!(26);
    std::fs::write(bad.join("config.json"), c2.to_string()).unwrap();
    assert!(err_text(Drafter::load(&bad, None, &mut p)).contains("`d2t` is I64 [27]"));
    // Absurd sizes are refused before any allocation.
    let mut c2 = cfg.clone();
    c2["head_dim"] = serde_json::json!(1u64 << 40);
    std::fs::write(bad.join("config.json"), c2.to_string()).unwrap();
    assert!(err_text(Drafter::load(&bad, None, &mut p)).contains("not plausible"));
    // Unsupported config.
    let mut c2 = cfg.clone();
    c2["num_hidden_layers"] = serde_json::json!(2);
    std::fs::write(bad.join("config.json"), c2.to_string()).unwrap();
    assert!(err_text(Drafter::load(&bad, None, &mut p)).contains("num_hidden_layers = 2"));
    // Wrong target: vocabulary, then aux layers beyond its depth.
    let mut small = target_cfg();
    small.vocab_size = 30;
    let other = random_model(small, 1, &mut p);
    assert!(err_text(Drafter::load(&dir, Some(&other), &mut p)).contains("vocab_size 40"));
    let mut shallow = target_cfg();
    shallow.num_hidden_layers = 2;
    let other = random_model(shallow, 1, &mut p);
    assert!(err_text(Drafter::load(&dir, Some(&other), &mut p)).contains("aux layer id 2"));
}

#[test]
fn missing_embedding_and_ids_come_from_the_target() {
    let mut p = VecProvider::new();
    let t = target(&mut p);
    let d = drafter(&t, &mut p);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    d.save(&dir).unwrap();
    // Re-write the file without embed_tokens and the config without aux ids (as published
    // checkpoints may be).
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<_> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "embed_tokens.weight")
        .collect();
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let m = cfg.as_object_mut().unwrap();
    m.remove("eagle_aux_hidden_state_layer_ids");
    m.remove("eagle_config");
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let e = err_text(Drafter::load(&dir, None, &mut p));
    assert!(e.contains("eagle_aux_hidden_state_layer_ids"), "{e}");
    let l = Drafter::load(&dir, Some(&t), &mut p).unwrap();
    assert_eq!(l.aux_layers(), [1, 2, 3]);
    assert_eq!(l.w(), d.w());
}

/// Greedy continuations of the target: `(tokens, prompt_len)`.
fn dataset(p: &mut VecProvider) -> Vec<(Vec<u32>, usize)> {
    let mut eng = Engine::new(
        target(p),
        EngineConfig {
            max_batch: 6,
            max_seq: 40,
        },
        p,
    )
    .unwrap();
    let reqs: Vec<GenRequest> = (0..6)
        .map(|i| GenRequest {
            prompt: tokens(4 + i % 3, 40, 100 + i as u64),
            max_tokens: 18,
            stop_tokens: vec![],
            sampling: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            adapter: None,
        })
        .collect();
    let outs = eng.generate(&reqs, false, p).unwrap();
    reqs.iter()
        .zip(outs)
        .map(|(r, o)| ([r.prompt.clone(), o.tokens].concat(), r.prompt.len()))
        .collect()
}

#[test]
fn training_on_target_continuations_lowers_loss_and_raises_accuracy() {
    let mut p = VecProvider::new();
    let t = target(&mut p);
    let data = dataset(&mut p);
    let d = drafter(&t, &mut p);
    let aux = d.aux_layers();
    let feats: Vec<Vec<f32>> = data
        .iter()
        .map(|(x, _)| aux_features(&t, x, &aux).unwrap())
        .collect();
    let batch: Vec<SeqFeatures> = data
        .iter()
        .zip(&feats)
        .map(|((x, pl), f)| SeqFeatures {
            tokens: x,
            feats: f,
            prompt_len: *pl,
        })
        .collect();
    let ttt = TttConfig {
        steps: 4,
        max_tokens: 160,
    };
    let opt = AdamW {
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut tr = DrafterTrainer::new(d, ttt, opt, &mut p).unwrap();
    let w0 = tr.drafter.w().to_vec();
    tr.warm_up().unwrap();
    assert_eq!(tr.drafter.w(), &w0[..], "warm-up leaves the weights");
    assert!(tr.grads().iter().all(|&g| g == 0.0));
    let allocs = p.allocations.len();
    let first = tr.evaluate(&batch).unwrap();
    for _ in 0..80 {
        let last = tr.train_step(&batch, 3e-3, Some(1.0)).unwrap();
        assert!(last.applied && last.grad_norm.is_finite());
    }
    let end = tr.evaluate(&batch).unwrap();
    assert_eq!(
        p.allocations.len(),
        allocs,
        "no buffer allocated after warm-up"
    );
    assert!(p.bytes(BufferTag::Activations) > 0);
    assert_eq!(
        end.tokens,
        data.iter()
            .map(|(x, pl)| x.len() - pl.max(&2))
            .sum::<usize>()
    );
    assert!(end.loss < 0.5 * first.loss, "{first:?} -> {end:?}");
    assert!(
        end.acc_per_step[0] > first.acc_per_step[0] + 0.2,
        "{first:?} -> {end:?}"
    );
    assert!(
        end.acc_per_step[3] > first.acc_per_step[3],
        "{first:?} -> {end:?}"
    );
    // Every third token id is outside the draft vocabulary: those labels are misses.
    let in_vocab = data
        .iter()
        .flat_map(|(x, pl)| x[(*pl).max(2)..].iter())
        .filter(|&&x| x % 3 != 1)
        .count();
    assert!(
        end.acc_per_step[0] > in_vocab as f64 / end.tokens as f64 - 0.05,
        "{end:?}"
    );
    eprintln!("{first:?} -> {end:?}");
    // The checkpoint written by the trainer loads into an equal trainer state.
    let tmp = tempfile::tempdir().unwrap();
    tr.save(&tmp.path().join("ck")).unwrap();
    let mut again =
        DrafterTrainer::load(&tmp.path().join("ck"), Some(&t), ttt, opt, &mut p).unwrap();
    assert_eq!(again.evaluate(&batch).unwrap(), end);
}
