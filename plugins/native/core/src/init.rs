//! `init` presets: random-initialised Llama models plus a locally trained tokenizer, written
//! as a Hugging Face directory (`config.json`, `model.safetensors`, `tokenizer.json`,
//! `tokenizer_config.json`, `generation_config.json`) that `AutoTokenizer` /
//! `AutoModelForCausalLM.from_pretrained` and vLLM load as it is.

use std::path::Path;

use serde_json::json;

use crate::buffer::BufferProvider;
use crate::config::{Arch, ModelConfig};
use crate::error::{NativeError, Result};
use crate::model::Model;
use crate::tokenizer;

/// Model size presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// ~3.0 M parameters: vocab 512, d 256, 4 layers, 4 heads / 2 KV heads, MLP 688.
    Tiny,
    /// ~24 M parameters: vocab 2048, d 512, 8 layers, 8 heads / 4 KV heads, MLP 1376.
    Small,
    /// ~255 M parameters: `Small`'s vocabulary and tokenizer, d 1024, 22 layers, 16 heads /
    /// 8 KV heads (head_dim 64), MLP 2752.
    Big,
}

impl Preset {
    /// Every preset, smallest first.
    pub const ALL: [Preset; 3] = [Preset::Tiny, Preset::Small, Preset::Big];

    /// The preset's name (`tiny`, `small`, `big`).
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Small => "small",
            Preset::Big => "big",
        }
    }

    /// Parses a preset's [`name`](Preset::name).
    pub fn parse(s: &str) -> Result<Self> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                NativeError::Input(format!(
                    "unknown preset `{s}`; use `tiny`, `small` or `big`"
                ))
            })
    }

    /// The model configuration of this preset.
    pub fn config(self) -> ModelConfig {
        let (vocab, d, layers, h, kv, ff) = match self {
            Preset::Tiny => (512, 256, 4, 4, 2, 688),
            Preset::Small => (2048, 512, 8, 8, 4, 1376),
            Preset::Big => (2048, 1024, 22, 16, 8, 2752),
        };
        ModelConfig {
            arch: Arch::Llama,
            vocab_size: vocab,
            hidden_size: d,
            intermediate_size: ff,
            num_hidden_layers: layers,
            num_attention_heads: h,
            num_key_value_heads: kv,
            head_dim: d / h,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            max_position_embeddings: 1024,
            tie_word_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
        }
    }
}

/// Deterministic built-in training text for the tokenizer: small arithmetic, digit
/// reversal and a few plain sentences (the shapes of the built-in RL tasks).
pub fn builtin_corpus() -> Vec<String> {
    let mut v = Vec::new();
    for a in 0..60u32 {
        for b in (0..60u32).step_by(7) {
            v.push(format!("Q: {a}+{b}=? A: {}", a + b));
            v.push(format!(
                "Q: reverse {a}{b} A: {}",
                format!("{a}{b}").chars().rev().collect::<String>()
            ));
        }
    }
    for s in [
        "The quick brown fox jumps over the lazy dog.",
        "Tandem trains and serves language models together.",
        "Answer the question with a number.",
    ] {
        v.push(s.to_string());
    }
    v
}

/// Writes a random-initialised `preset` model with a freshly trained tokenizer into `out`.
/// Returns the model (weights in a provider buffer).
pub fn init_preset(
    preset: Preset,
    out: &Path,
    seed: u64,
    provider: &mut dyn BufferProvider,
) -> Result<Model> {
    let cfg = preset.config();
    std::fs::create_dir_all(out).map_err(|e| NativeError::io(out, e))?;
    let tk = tokenizer::train_bpe(&builtin_corpus(), cfg.vocab_size)?;
    tokenizer::save(&tk, out)?;
    let mut model = Model::new_zeroed(cfg, provider)?;
    model.init_random(seed, 0.02);
    model.save(out)?;
    let gen_cfg =
        json!({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": true});
    let path = out.join("generation_config.json");
    std::fs::write(&path, gen_cfg.to_string()).map_err(|e| NativeError::io(&path, e))?;
    // Without it transformers loads tokenizer.json with no special tokens named (no BOS,
    // EOS or pad). Encoding adds no special token, like the `tokenizers` crate's
    // `encode(text, false)` Tandem uses: prompts get BOS from the caller.
    let [pad, bos, eos] = tokenizer::SPECIAL_TOKENS;
    let tk_cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": model.cfg.max_position_embeddings,
    });
    let path = out.join("tokenizer_config.json");
    std::fs::write(&path, tk_cfg.to_string()).map_err(|e| NativeError::io(&path, e))?;
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::VecProvider;

    #[test]
    fn presets_have_the_documented_sizes() {
        let count = |p: Preset| {
            crate::layout::ParamLayout::for_model(&p.config())
                .0
                .num_params()
        };
        let tiny = count(Preset::Tiny);
        let small = count(Preset::Small);
        let big = count(Preset::Big);
        assert!((1_000_000..4_000_000).contains(&tiny), "{tiny}");
        assert!((15_000_000..30_000_000).contains(&small), "{small}");
        assert!((240_000_000..270_000_000).contains(&big), "{big}");
        assert_eq!(Preset::Big.config().head_dim, 64);
        assert_eq!(
            Preset::Big.config().vocab_size,
            Preset::Small.config().vocab_size
        );
        for p in Preset::ALL {
            assert_eq!(Preset::parse(p.name()).ok(), Some(p));
        }
        assert!(Preset::parse("huge").is_err());
    }

    #[test]
    fn tiny_preset_writes_a_loadable_hf_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = VecProvider::new();
        let m = init_preset(Preset::Tiny, dir.path(), 1, &mut p).unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            assert!(dir.path().join(f).exists(), "{f}");
        }
        let text = std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap();
        let tk_cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(tk_cfg["bos_token"], tokenizer::SPECIAL_TOKENS[1]);
        assert_eq!(tk_cfg["eos_token"], tokenizer::SPECIAL_TOKENS[2]);
        let back = Model::load(dir.path(), &mut p).unwrap();
        assert_eq!(back.w(), m.w());
        let tk = tokenizer::load(dir.path()).unwrap();
        assert!(tk.get_vocab_size(true) <= m.cfg.vocab_size);
        let ids = tokenizer::encode(&tk, "Q: 12+5=? A: 17").unwrap();
        assert!(ids.iter().all(|&i| (i as usize) < m.cfg.vocab_size));
    }
}
