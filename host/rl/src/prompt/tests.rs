//! Tests of prompt encoding: chat prompts with special tokens as single ids, plain prompts with
//! BOS, stop ids, and template errors with this loop's help (the templates themselves are
//! tested in `tandem-model`'s `chat`).

#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

/// SmolLM2-Instruct's template (a default system message when none is given).
const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte → character map of byte-level BPE.
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (33..127).chain(161..173).chain(174..256).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.into_iter().zip(cs) {
        out[b as usize] = char::from_u32(c).unwrap();
    }
    out
}

/// A model directory with a byte-level tokenizer whose ids 0, 1, 2 are `<|endoftext|>`,
/// `<|im_start|>`, `<|im_end|>` (as SmolLM2's), plus `files` (name, JSON).
pub(crate) fn model_dir(files: &[(&str, serde_json::Value)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut vocab = serde_json::Map::new();
    for (i, s) in specials.iter().enumerate() {
        vocab.insert((*s).into(), json!(i));
    }
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i + 3));
    }
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []},
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = json!({"bos_token_id": 1, "eos_token_id": 0});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    for (name, v) in files {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

pub(crate) fn chatml_config() -> (&'static str, serde_json::Value) {
    (
        "tokenizer_config.json",
        json!({"chat_template": CHATML, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}),
    )
}

#[test]
fn chat_prompts_encode_special_tokens_as_single_ids_without_bos() {
    let dir = model_dir(&[
        chatml_config(),
        ("generation_config.json", json!({"eos_token_id": 2})),
    ]);
    let codec = PromptCodec::load_with(dir.path(), true, Some("Be brief.")).unwrap();
    assert!(codec.is_chat());
    let ids = codec.prompt("Hi").unwrap();
    // <|im_start|> "system\nBe brief." <|im_end|> "\n" <|im_start|> "user\nHi" ...
    assert_eq!(
        ids[0], 1,
        "the template's <|im_start|>, no BOS added before it"
    );
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
    assert_eq!(
        codec.decode(&ids).unwrap(),
        "system\nBe brief.\nuser\nHi\nassistant\n"
    );
    // generation_config.json's EOS wins over config.json's.
    assert_eq!(codec.stop_ids(), &[2]);
    // Plain prompts: BOS, then the text; EOS from config.json without a generation config.
    let plain_dir = model_dir(&[]);
    let plain = PromptCodec::load(plain_dir.path()).unwrap();
    let ids = plain.prompt("Hi").unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.len(), 3);
    assert_eq!(plain.stop_ids(), &[0]);
    assert_eq!(plain.render("Hi").unwrap(), "Hi");
}

#[test]
fn a_missing_template_is_one_line_naming_the_directory() {
    let dir = model_dir(&[("tokenizer_config.json", json!({"bos_token": "<s>"}))]);
    // Plain prompts do not need it.
    assert!(PromptCodec::load_with(dir.path(), false, None).is_ok());
    let e = PromptCodec::load_with(dir.path(), true, None)
        .err()
        .unwrap();
    let text = e.to_string();
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
    assert!(text.contains("no chat template"), "{text}");
    assert!(!text.contains('\n'));
    assert!(e.help().unwrap().contains("chat = false"));
    // A template that fails to render: the model's error, with this loop's way around it.
    let dir = model_dir(&[(
        "chat_template.jinja",
        json!("{{ raise_exception('no user turns here') }}"),
    )]);
    let codec = PromptCodec::load_with(dir.path(), true, None).unwrap();
    let e = codec.prompt("q").unwrap_err();
    assert!(e.to_string().contains("no user turns here"), "{e}");
    assert!(e.help().unwrap().contains("chat = false"));
}
