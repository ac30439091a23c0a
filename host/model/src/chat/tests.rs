//! Tests of chat templates: the exact ChatML text, the Hugging Face template features, where a
//! template and its special tokens come from, and the errors.

#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

/// SmolLM2-Instruct's template (a default system message when none is given).
const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A word-level tokenizer whose ids 0, 1, 2 are `<|endoftext|>`, `<|im_start|>`,
/// `<|im_end|>` (as SmolLM2's).
fn tokenizer() -> Tokenizer {
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "unk_token": "<|endoftext|>",
                  "vocab": {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}},
    });
    Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap()
}

/// A model directory holding `files` (name, JSON; a JSON string is written as its text).
fn model_dir(files: &[(&str, serde_json::Value)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, v) in files {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

/// The template of `dir` with BOS id 1 and EOS id 0 (as in `config.json`), rendering one user
/// message `q`.
fn render_q(dir: &tempfile::TempDir) -> String {
    let t = ChatTemplate::load(dir.path(), &tokenizer(), Some(1), Some(0)).unwrap();
    t.render(&[Message::new("user", "q")]).unwrap()
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
    assert_eq!(e.help(), Some("fix the template"));
}

#[test]
fn template_sources_and_special_tokens() {
    // A named list: the `default` one; bos/eos from the tokenizer when the config has none.
    let list = json!({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}"},
    ]});
    let dir = model_dir(&[("tokenizer_config.json", list)]);
    assert_eq!(render_q(&dir), "<|im_start|>|q|<|endoftext|>");
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
    assert_eq!(render_q(&dir), "q<|im_end|>");
}

#[test]
fn a_missing_template_is_one_line_naming_the_directory() {
    let dir = model_dir(&[("tokenizer_config.json", json!({"bos_token": "<s>"}))]);
    let e = ChatTemplate::load(dir.path(), &tokenizer(), Some(1), Some(0)).unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
    assert!(text.contains("no chat template"), "{text}");
    assert!(!text.contains('\n'));
    assert!(e.help().unwrap().contains("chat_template.jinja"));
    // A malformed tokenizer_config.json names the file.
    let dir = model_dir(&[("tokenizer_config.json", json!("{"))]);
    let e = ChatTemplate::load(dir.path(), &tokenizer(), None, None).unwrap_err();
    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");
}

#[test]
fn chatml_renders_append_only_turn_by_turn() {
    let t = ChatTemplate::new(CHATML, "", "<|im_end|>");
    let found = t
        .check_append_only(&tokenizer(), &probe_conversation())
        .unwrap();
    assert_eq!(found.turns, 6);
    assert!(found.tokens > 6, "{found:?}");
}

#[test]
fn a_template_that_drops_past_reasoning_is_not_append_only() {
    // Qwen3's way: an assistant turn before the last user message loses its <think> part.
    let drops = "{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}{% endif %}<|im_start|>{{ m['role'] }}\n{{ c }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let t = ChatTemplate::new(drops, "", "<|im_end|>");
    let mut conversation = probe_conversation();
    conversation[2].content = "<think>12 and 30</think>42".into();
    let e = t
        .check_append_only(&tokenizer(), &conversation)
        .unwrap_err();
    let line = e.to_string();
    assert!(
        line.contains("not append-only") && line.contains("turn 4 (user)"),
        "{line}"
    );
    assert!(!line.contains('\n'), "one line: {line}");
}

#[test]
fn pieces_that_tokenize_differently_joined_are_not_append_only() {
    // No separator between messages: "ab" then "cd" is one word joined, two apart.
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "",
        "",
    );
    let conversation = [Message::new("user", "ab"), Message::new("assistant", "cd")];
    let e = t
        .check_append_only(&tokenizer(), &conversation)
        .unwrap_err();
    assert!(e.to_string().contains("turn 2 (assistant)"), "{e}");
    assert!(e.to_string().contains("joins differently"), "{e}");
}
