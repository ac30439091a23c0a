//! Hugging Face / PEFT file formats: save → load round trips, bf16 and sharded checkpoints,
//! config parsing and its errors.
#![allow(clippy::unwrap_used, clippy::type_complexity)]

use crate::common;

use std::collections::HashMap;

use common::random_model;
use safetensors::tensor::{Dtype, TensorView};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::{Arch, ModelConfig};
use tandem_native_core::lora::{ALL_TARGETS, LoraAdapter, LoraConfig};
use tandem_native_core::model::Model;

#[test]
fn model_round_trips_through_hf_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = VecProvider::new();
    let m = random_model(common::tiny_cfg(Arch::Qwen2, false), 1, &mut p);
    m.save(dir.path()).unwrap();
    let cfg_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg_json["model_type"], "qwen2");
    assert_eq!(cfg_json["architectures"][0], "Qwen2ForCausalLM");
    let back = Model::load(dir.path(), &mut p).unwrap();
    assert_eq!(back.cfg, m.cfg);
    assert_eq!(back.w(), m.w());
    assert!(
        back.layout
            .get("model.layers.1.self_attn.k_proj.bias")
            .is_some()
    );
    assert_eq!(
        back.layout
            .get("model.layers.0.self_attn.q_proj.weight")
            .unwrap()
            .shape,
        vec![16, 16]
    );
}

fn write_st(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<u8>, Dtype)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d, t)| (n.clone(), TensorView::new(*t, s.clone(), d).unwrap()))
        .collect();
    std::fs::write(
        path,
        safetensors::serialize(views, None::<HashMap<String, String>>).unwrap(),
    )
    .unwrap();
}

#[test]
fn sharded_bf16_checkpoint_loads_and_tied_lm_head_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = VecProvider::new();
    let m = random_model(common::tiny_cfg(Arch::Llama, true), 2, &mut p);
    m.cfg.save(dir.path()).unwrap();
    // Split tensors across two bf16 shards + an index; add a stray lm_head (tied → ignored).
    let mut shards: [Vec<(String, Vec<usize>, Vec<u8>, Dtype)>; 2] = [vec![], vec![]];
    let mut map = serde_json::Map::new();
    for (i, e) in m.layout.entries().iter().enumerate() {
        let bytes: Vec<u8> = m.w()[e.range()]
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect();
        let f = format!("model-0000{}-of-00002.safetensors", i % 2 + 1);
        map.insert(e.name.clone(), serde_json::Value::String(f));
        shards[i % 2].push((e.name.clone(), e.shape.clone(), bytes, Dtype::BF16));
    }
    shards[0].push((
        "lm_head.weight".into(),
        vec![13, 16],
        vec![0u8; 13 * 16 * 2],
        Dtype::BF16,
    ));
    map.insert(
        "lm_head.weight".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    for (i, s) in shards.iter().enumerate() {
        write_st(
            &dir.path()
                .join(format!("model-0000{}-of-00002.safetensors", i + 1)),
            s,
        );
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let back = Model::load(dir.path(), &mut p).unwrap();
    for (a, b) in back.w().iter().zip(m.w()) {
        assert!(
            (a - b).abs() <= b.abs() / 128.0 + 1e-6,
            "bf16 conversion off: {a} vs {b}"
        );
    }
    // A missing tensor is reported by name.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = Model::load(dir.path(), &mut p).err().unwrap().to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
}

#[test]
fn config_errors_are_clear() {
    let bad = serde_json::json!({"model_type": "gpt2", "vocab_size": 10});
    let e = ModelConfig::from_json(&bad).unwrap_err().to_string();
    assert!(e.contains("gpt2") && e.contains("llama"), "{e}");
    let mut c = common::tiny_cfg(Arch::Llama, false).to_json();
    c["num_key_value_heads"] = 3.into();
    let e = ModelConfig::from_json(&c).unwrap_err().to_string();
    assert!(e.contains("num_key_value_heads"), "{e}");
    let mut c = common::tiny_cfg(Arch::Llama, false).to_json();
    c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    assert!(
        ModelConfig::from_json(&c)
            .unwrap_err()
            .to_string()
            .contains("rope")
    );
    // Llama attention_bias → q/k/v/o biases; Qwen2 → q/k/v only.
    let mut c = common::tiny_cfg(Arch::Llama, false).to_json();
    c["attention_bias"] = true.into();
    let l = ModelConfig::from_json(&c).unwrap();
    assert!(l.qkv_bias && l.o_bias);
    let q = ModelConfig::from_json(&common::tiny_cfg(Arch::Qwen2, false).to_json()).unwrap();
    assert!(q.qkv_bias && !q.o_bias);
}

#[test]
fn lora_adapter_saves_in_peft_format_and_loads_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = VecProvider::new();
    let cfg = common::tiny_cfg(Arch::Llama, false);
    let lc = LoraConfig {
        r: 4,
        alpha: 16.0,
        targets: ALL_TARGETS.to_vec(),
        base_model: "tiny-base".into(),
    };
    let mut ad = LoraAdapter::new(&cfg, lc, &mut p).unwrap();
    ad.init_a(5);
    let n = ad.layout.total_len();
    ad.weights
        .as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x += (i % 7) as f32 * 0.01);
    ad.save(dir.path()).unwrap();
    let conf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(conf["peft_type"], "LORA");
    assert_eq!(conf["task_type"], "CAUSAL_LM");
    assert_eq!(conf["r"], 4);
    assert_eq!(conf["lora_alpha"], 16.0);
    assert_eq!(conf["bias"], "none");
    assert_eq!(conf["fan_in_fan_out"], false);
    assert_eq!(conf["base_model_name_or_path"], "tiny-base");
    assert_eq!(conf["target_modules"].as_array().unwrap().len(), 7);
    let bytes = std::fs::read(dir.path().join("adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let a = st
        .tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
        .unwrap();
    assert_eq!(a.shape(), &[4, 16]);
    let b = st
        .tensor("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")
        .unwrap();
    assert_eq!(b.shape(), &[16, 4]);
    assert_eq!(st.len(), 2 * 7 * 2);
    let back = LoraAdapter::load(dir.path(), &cfg, &mut p).unwrap();
    assert_eq!(back.cfg.targets, ALL_TARGETS.to_vec());
    assert_eq!(&back.weights.as_slice()[..n], &ad.weights.as_slice()[..n]);
}
