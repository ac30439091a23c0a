//! Merges of hand-made models and adapters: the numbers against a hand-computed case,
//! rsLoRA's scale, dtypes, shards, and every refusal leaving nothing behind.

use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::json;

use super::tensors::{from_f32, to_f32};
use super::*;

const Q: &str = "model.layers.0.self_attn.q_proj.weight";
const EMB: &str = "model.embed_tokens.weight";
const A: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
const B: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";

/// W (3×2) of the hand-computed case.
const W: [f32; 6] = [0.5, -1.0, 2.0, 0.25, 0.0, 1.5];

fn st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| from_f32(t.1, &t.3)).collect();
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| (t.0, TensorView::new(t.1, t.2.clone(), b).unwrap()))
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::tensor::serialize_to_file(views, Some(meta), path).unwrap();
}

fn read(path: &Path, name: &str) -> (Dtype, Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let s = SafeTensors::deserialize(&bytes).unwrap();
    let v = s.tensor(name).unwrap();
    (v.dtype(), v.shape().to_vec(), to_f32(v.dtype(), v.data()))
}

/// A base model: q_proj (3×2, `dtype`) and a BF16 embedding, config and a tokenizer.
fn base(dir: &Path, dtype: Dtype) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        json!({"model_type": "llama", "torch_dtype": "bfloat16"}).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{{ messages }}").unwrap();
    st(
        &dir.join("model.safetensors"),
        &[
            (Q, dtype, vec![3, 2], W.to_vec()),
            (EMB, Dtype::BF16, vec![4, 2], vec![0.125; 8]),
        ],
    );
}

/// An adapter of rank `r` on q_proj with `config` merged into its adapter_config.json.
fn adapter(dir: &Path, r: usize, a: Vec<f32>, b: Vec<f32>, config: serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let mut c = json!({
        "peft_type": "LORA", "r": r, "lora_alpha": 2.0, "target_modules": ["q_proj"],
        "use_rslora": false, "use_dora": false, "modules_to_save": null, "bias": "none",
    });
    for (k, v) in config.as_object().unwrap() {
        c[k] = v.clone();
    }
    std::fs::write(dir.join("adapter_config.json"), c.to_string()).unwrap();
    st(
        &dir.join("adapter_model.safetensors"),
        &[
            (A, Dtype::F32, vec![r, 2], a),
            (B, Dtype::F32, vec![3, r], b),
        ],
    );
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6)
}

#[test]
fn a_rank_one_adapter_merges_to_the_hand_computed_weights() {
    let t = tempfile::tempdir().unwrap();
    let (b, ad, out) = (t.path().join("b"), t.path().join("a"), t.path().join("o"));
    base(&b, Dtype::F32);
    // scale = 2 / 1; B·A = [1, 0, -1]ᵀ [1, 2] = [[1, 2], [0, 0], [-1, -2]].
    adapter(&ad, 1, vec![1.0, 2.0], vec![1.0, 0.0, -1.0], json!({}));
    let r = merge_lora(&b, &ad, &out, &MergeOptions::default()).unwrap();
    assert_eq!(
        (r.merged, r.tensors, r.rank, r.scale, r.files),
        (1, 2, 1, 2.0, 1)
    );
    let (dtype, shape, w) = read(&out.join("model.safetensors"), Q);
    assert_eq!((dtype, shape), (Dtype::F32, vec![3, 2]));
    assert!(close(&w, &[2.5, 3.0, 2.0, 0.25, -2.0, -2.5]), "{w:?}");
    // The rest as it was, in its dtype; config and companions from the base.
    let (dtype, _, e) = read(&out.join("model.safetensors"), EMB);
    assert_eq!((dtype, e), (Dtype::BF16, vec![0.125; 8]));
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(config.contains("bfloat16"), "{config}");
    for f in ["tokenizer.json", "chat_template.jinja"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    // No staging directory left.
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 3);
}

#[test]
fn rslora_scales_by_alpha_over_sqrt_r() {
    let t = tempfile::tempdir().unwrap();
    let b = t.path().join("b");
    base(&b, Dtype::F32);
    // r = 4, alpha = 2: plain 0.5, rsLoRA 1.0; every product B·A entry is 4 · 0.25 · 1 = 1.
    for (rs, scale) in [(false, 0.5f32), (true, 1.0)] {
        let ad = t.path().join(format!("a{rs}"));
        let out = t.path().join(format!("o{rs}"));
        adapter(
            &ad,
            4,
            vec![1.0; 8],
            vec![0.25; 12],
            json!({"use_rslora": rs}),
        );
        let r = merge_lora(&b, &ad, &out, &MergeOptions::default()).unwrap();
        assert_eq!(r.scale, scale);
        let (_, _, w) = read(&out.join("model.safetensors"), Q);
        let want: Vec<f32> = W.iter().map(|x| x + scale).collect();
        assert!(close(&w, &want), "rslora {rs}: {w:?} vs {want:?}");
    }
}

#[test]
fn a_bf16_base_stays_bf16_unless_f32_is_asked() {
    let t = tempfile::tempdir().unwrap();
    let (b, ad) = (t.path().join("b"), t.path().join("a"));
    base(&b, Dtype::BF16);
    adapter(&ad, 1, vec![1.0, 2.0], vec![1.0, 0.0, -1.0], json!({}));
    let want = [2.5, 3.0, 2.0, 0.25, -2.0, -2.5];
    let out = t.path().join("keep");
    merge_lora(&b, &ad, &out, &MergeOptions::default()).unwrap();
    let (dtype, _, w) = read(&out.join("model.safetensors"), Q);
    assert_eq!(dtype, Dtype::BF16);
    assert!(close(&w, &want), "{w:?}");
    let out = t.path().join("f32");
    merge_lora(&b, &ad, &out, &MergeOptions { to_f32: true }).unwrap();
    for name in [Q, EMB] {
        assert_eq!(read(&out.join("model.safetensors"), name).0, Dtype::F32);
    }
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(config.contains("float32"), "{config}");
}

#[test]
fn a_sharded_base_keeps_its_shards_and_index() {
    let t = tempfile::tempdir().unwrap();
    let (b, ad, out) = (t.path().join("b"), t.path().join("a"), t.path().join("o"));
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(b.join("config.json"), "{}").unwrap();
    st(
        &b.join("s1.safetensors"),
        &[(Q, Dtype::F32, vec![3, 2], W.to_vec())],
    );
    st(
        &b.join("s2.safetensors"),
        &[(EMB, Dtype::F32, vec![4, 2], vec![1.0; 8])],
    );
    let index = json!({"metadata": {"total_size": 56},
                       "weight_map": {Q: "s1.safetensors", EMB: "s2.safetensors"}});
    std::fs::write(b.join(tensors::INDEX), index.to_string()).unwrap();
    adapter(&ad, 1, vec![1.0, 2.0], vec![1.0, 0.0, -1.0], json!({}));
    let r = merge_lora(&b, &ad, &out, &MergeOptions::default()).unwrap();
    assert_eq!(r.files, 2);
    let (_, _, w) = read(&out.join("s1.safetensors"), Q);
    assert!(close(&w, &[2.5, 3.0, 2.0, 0.25, -2.0, -2.5]), "{w:?}");
    assert_eq!(read(&out.join("s2.safetensors"), EMB).2, vec![1.0; 8]);
    let written = tensors::read_json(&out.join(tensors::INDEX)).unwrap();
    assert_eq!(written, index);
}

/// Runs a merge that must fail; returns its message (one line) and checks that nothing
/// was written next to the inputs.
fn refused(b: &Path, ad: &Path, t: &Path) -> String {
    let before = std::fs::read_dir(t).unwrap().count();
    let out = t.join("out");
    let e = merge_lora(b, ad, &out, &MergeOptions::default()).unwrap_err();
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(t).unwrap().count(), before, "left files");
    let m = e.to_string();
    assert_eq!(m.lines().count(), 1, "{m}");
    m
}

#[test]
fn unsupported_adapters_are_refused_in_one_line_and_nothing_is_written() {
    let t = tempfile::tempdir().unwrap();
    let b = t.path().join("b");
    base(&b, Dtype::F32);
    let cases = [
        (json!({"use_dora": true}), "DoRA"),
        (json!({"modules_to_save": ["lm_head"]}), "modules_to_save"),
        (json!({"peft_type": "IA3"}), "only LORA"),
        (json!({"bias": "all"}), "bias"),
        (json!({"rank_pattern": {"q_proj": 8}}), "rank_pattern"),
        (json!({"target_modules": ["v_proj"]}), "target_modules"),
        (json!({"r": 2}), "r = 2"),
        (json!({"trainable_token_indices": [5]}), "trainable tokens"),
        (
            json!({"target_parameters": ["experts.w1"]}),
            "target_parameters",
        ),
    ];
    for (i, (config, want)) in cases.into_iter().enumerate() {
        let ad = t.path().join(format!("a{i}"));
        adapter(&ad, 1, vec![1.0, 2.0], vec![1.0, 0.0, -1.0], config);
        let m = refused(&b, &ad, t.path());
        assert!(m.contains(want), "{want}: {m}");
    }
}

#[test]
fn an_adapter_for_another_model_names_the_tensor_and_both_shapes() {
    let t = tempfile::tempdir().unwrap();
    let b = t.path().join("b");
    base(&b, Dtype::F32);
    let ad = t.path().join("wide");
    // A is [1, 3]: the base's q_proj takes 2 inputs.
    adapter(&ad, 1, vec![1.0; 2], vec![1.0; 3], json!({}));
    st(
        &ad.join("adapter_model.safetensors"),
        &[
            (A, Dtype::F32, vec![1, 3], vec![1.0; 3]),
            (B, Dtype::F32, vec![3, 1], vec![1.0; 3]),
        ],
    );
    let m = refused(&b, &ad, t.path());
    assert!(
        m.contains(A) && m.contains("[1, 3]") && m.contains("[3, 2]"),
        "{m}"
    );
    // A tensor the base lacks.
    let ad = t.path().join("other");
    adapter(&ad, 1, vec![1.0; 2], vec![1.0; 3], json!({}));
    let k = "base_model.model.model.layers.7.self_attn.q_proj.lora_";
    st(
        &ad.join("adapter_model.safetensors"),
        &[
            (
                &format!("{k}A.weight"),
                Dtype::F32,
                vec![1, 2],
                vec![1.0; 2],
            ),
            (
                &format!("{k}B.weight"),
                Dtype::F32,
                vec![3, 1],
                vec![1.0; 3],
            ),
        ],
    );
    let m = refused(&b, &ad, t.path());
    assert!(m.contains("model.layers.7.self_attn.q_proj.weight"), "{m}");
}

#[test]
fn a_taken_out_dir_and_missing_inputs_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let (b, ad) = (t.path().join("b"), t.path().join("a"));
    base(&b, Dtype::F32);
    adapter(&ad, 1, vec![1.0, 2.0], vec![1.0, 0.0, -1.0], json!({}));
    let out = t.path().join("taken");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = merge_lora(&b, &ad, &out, &MergeOptions::default()).unwrap_err();
    assert!(e.to_string().contains("not an empty directory"), "{e}");
    assert_eq!(e.help(), Some("choose a new --out"));
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
    // An empty --out is fine.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    merge_lora(&b, &ad, &empty, &MergeOptions::default()).unwrap();
    assert!(empty.join("model.safetensors").is_file());
    // The adapter as base, the base as adapter.
    let m = refused(&ad, &ad, t.path());
    assert!(m.contains("no config.json"), "{m}");
    let m = refused(&b, &b, t.path());
    assert!(m.contains("adapter_config.json"), "{m}");
}
