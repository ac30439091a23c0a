//! Tests of prompt encoding: chat templates rendered to the exact ChatML text, special tokens
//! as single ids, stop ids, template sources and their errors.

#![allow(clippy::unwrap_used)]

use super::template::{ChatTemplate, Message};
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
fn chatml_renders_the_exact_text() {
    let t = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>");
    let text = t.render(&[Message::new("user", "What is 2+3?")]).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    );
    let text = t
        .render(&[
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
        ])
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn hf_template_features_render() {
    // lstrip/trim blocks, `.strip()` (pycompat), bos/eos variables, loop controls.
    let src = "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'x' %}{% break %}{% endif %}\n[{{ m.content.strip() }}]{{ eos_token }}\n{% endfor %}\n";
    let t = ChatTemplate::new(src, "<s>", "</s>");
    let text = t
        .render(&[Message::new("user", "  a  "), Message::new("x", "b")])
        .unwrap();
    assert_eq!(text, "<s>\n[a]</s>\n");
    let t = ChatTemplate::new("{{ raise_exception('only user turns') }}", "", "");
    let e = t.render(&[Message::new("user", "a")]).unwrap_err();
    assert!(e.to_string().contains("only user turns"), "{e}");
    assert!(!e.to_string().contains('\n'), "{e}");
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
fn template_sources_and_special_tokens() {
    // A named list: the `default` one; bos/eos from the tokenizer when the config has none.
    let list = json!({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}"},
    ]});
    let dir = model_dir(&[("tokenizer_config.json", list)]);
    let codec = PromptCodec::load_with(dir.path(), true, None).unwrap();
    assert_eq!(codec.render("q").unwrap(), "<|im_start|>|q|<|endoftext|>");
    // chat_template.jinja wins over tokenizer_config.json; added-token objects name tokens.
    let dir = model_dir(&[
        (
            "tokenizer_config.json",
            json!({"chat_template": "CONFIG", "eos_token": {"content": "<|im_end|>"}}),
        ),
        (
            "chat_template.jinja",
            json!("{{ messages[0].content }}{{ eos_token }}\n"),
        ),
    ]);
    let codec = PromptCodec::load_with(dir.path(), true, None).unwrap();
    assert_eq!(codec.render("q").unwrap(), "q<|im_end|>");
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
}
