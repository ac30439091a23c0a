//! `tandem model check-template`: the chat template of a model renders a conversation
//! append-only, turn by turn, as text and as the model's tokens — SmolLM2's ChatML on the
//! tiny preset's tokenizer passes; a template that drops past reasoning is one line naming
//! the template file and the turn.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::rl::*;

/// SmolLM2-Instruct's template.
const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Empties every assistant turn but the last: the way Qwen3 drops past reasoning, taken to
/// the whole turn.
const DROPS: &str = "{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' and not loop.last %}{% set c = '' %}{% endif %}<|im_start|>{{ m['role'] }}\n{{ c }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

#[test]
fn the_tiny_tokenizer_with_chatml_is_append_only_and_a_dropping_template_is_one_line() {
    let t = Scratch::new();
    let model = t.dir.join("model");
    std::fs::write(model.join("chat_template.jinja"), CHATML).unwrap();
    let out = t.tandem(&["model", "check-template", model.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        out.stdout_text().contains("is append-only: 6 turns"),
        "{}",
        out.stdout_text()
    );

    std::fs::write(model.join("chat_template.jinja"), DROPS).unwrap();
    let out = t.tandem(&["model", "check-template", model.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr_text());
    let lines = crate::common::error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("chat_template.jinja")
            && lines[0].contains("not append-only")
            && lines[0].contains("turn 4 (user)"),
        "{}",
        lines[0]
    );
}
