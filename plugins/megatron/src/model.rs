//! What the `megatron` trainer can build from a model directory, checked from its
//! `config.json` before anything starts (`tandem check`, the constructor): a Llama- or
//! Qwen2-style decoder (SwiGLU with silu, unscaled RoPE, no Llama biases, no sliding window)
//! whose heads, KV groups, FFN width and vocabulary divide by `tp`. The worker's converter
//! checks the same at `init` (`python/tandem_megatron_worker/convert.py`, `Spec`).

use std::path::Path;

use serde::Deserialize;
use tandem_plugin_api::ConfigProblem;

/// Architectures the converter maps (HF names).
pub const ARCHITECTURES: [&str; 2] = ["LlamaForCausalLM", "Qwen2ForCausalLM"];

/// The fields of `config.json` the checks read.
#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    num_attention_heads: u32,
    #[serde(default)]
    num_key_value_heads: Option<u32>,
    intermediate_size: u32,
    vocab_size: u32,
    /// RoPE settings: `rope_scaling` (transformers 4) or `rope_parameters` (5).
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
}

/// The RoPE type a settings object names (`rope_type`, or `type` in older files).
fn rope_type(v: &serde_json::Value) -> Option<&str> {
    v.get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(serde_json::Value::as_str)
}

/// Problems of the model at `dir` for tensor-parallel size `tp` (key `tp` or the empty key
/// for the model itself). A directory without `config.json` is left to the loader's own
/// message at `init`.
pub fn problems(dir: &Path, tp: u32) -> Vec<ConfigProblem> {
    let path = dir.join("config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    let cfg: HfConfig = match serde_json::from_str(&text) {
        Ok(c) => c,
        Err(e) => {
            return vec![ConfigProblem::new(
                "",
                format!(
                    "{}: not a model config this trainer reads: {e}",
                    path.display()
                ),
            )];
        }
    };
    let mut p = Vec::new();
    let arch = cfg.architectures.first().map_or("(none)", String::as_str);
    if !ARCHITECTURES.contains(&arch) {
        p.push(
            ConfigProblem::new(
                "",
                format!(
                    "model {} is a {arch}; the megatron trainer converts {}",
                    dir.display(),
                    ARCHITECTURES.join(" and ")
                ),
            )
            .with_help("use the fsdp or native trainer for other architectures"),
        );
    }
    let scaled = [&cfg.rope_scaling, &cfg.rope_parameters]
        .into_iter()
        .flatten()
        .filter_map(rope_type)
        .find(|t| *t != "default");
    let mut unsupported = Vec::new();
    if let Some(t) = scaled {
        unsupported.push(format!("RoPE type `{t}` (only unscaled RoPE)"));
    }
    if let Some(act) = cfg.hidden_act.as_deref().filter(|a| *a != "silu") {
        unsupported.push(format!("hidden_act `{act}` (SwiGLU with silu only)"));
    }
    if arch == "LlamaForCausalLM" && cfg.attention_bias {
        unsupported.push("attention_bias = true (Llama's o_proj bias)".into());
    }
    if cfg.mlp_bias {
        unsupported.push("mlp_bias = true".into());
    }
    if cfg.use_sliding_window {
        unsupported.push("use_sliding_window = true".into());
    }
    for what in unsupported {
        p.push(
            ConfigProblem::new(
                "",
                format!(
                    "model {} sets {what}, which the megatron converter does not map",
                    dir.display()
                ),
            )
            .with_help("use the fsdp trainer for this model"),
        );
    }
    let kv = cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads);
    for (what, n) in [
        ("attention heads", cfg.num_attention_heads),
        ("key/value heads", kv),
        ("intermediate_size", cfg.intermediate_size),
        ("vocab_size", cfg.vocab_size),
    ] {
        if tp > 0 && n % tp != 0 {
            p.push(
                ConfigProblem::new(
                    "tp",
                    format!("the model's {what} ({n}) do not divide by tp = {tp}"),
                )
                .with_help("pick a tp that divides the heads, KV heads, FFN width and vocabulary"),
            );
        }
    }
    p
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn model(json: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.json"), json).unwrap();
        d
    }

    const LLAMA: &str = r#"{"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 512}"#;

    #[test]
    fn divisibility_and_architecture() {
        let d = model(LLAMA);
        assert!(problems(d.path(), 2).is_empty());
        let p = problems(d.path(), 4);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            p[0].message.as_str(),
            "the model's key/value heads (2) do not divide by tp = 4"
        );
        let d = model(&LLAMA.replace("LlamaForCausalLM", "GPT2LMHeadModel"));
        let p = problems(d.path(), 1);
        assert!(p[0].message.contains("is a GPT2LMHeadModel"), "{p:?}");
        assert!(problems(Path::new("/nonexistent"), 2).is_empty());
    }

    #[test]
    fn rope_activation_and_bias_variants() {
        let with = |extra: &str| {
            model(&LLAMA.replace(
                "\"vocab_size\": 512",
                &format!("\"vocab_size\": 512, {extra}"),
            ))
        };
        let d = with(r#""rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}"#);
        assert!(problems(d.path(), 1).is_empty());
        let d = with(r#""rope_scaling": {"type": "linear", "factor": 2.0}"#);
        assert!(
            problems(d.path(), 1)[0]
                .message
                .contains("RoPE type `linear`")
        );
        let d = with(r#""hidden_act": "gelu", "attention_bias": true"#);
        let msgs: Vec<String> = problems(d.path(), 1)
            .iter()
            .map(|p| p.message.to_string())
            .collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(
            msgs[0].contains("hidden_act `gelu`") && msgs[1].contains("attention_bias"),
            "{msgs:?}"
        );
    }
}
