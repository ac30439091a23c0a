//! The model's text side: its tokenizer (`tokenizer.json`), stop ids
//! (`tandem_model::tokens::special_ids`), and chat template (`tandem_model::chat`:
//! `chat_template.jinja` or `tokenizer_config.json`'s `chat_template`; a model without one
//! is rendered through ChatML, SGLang's fallback for unknown models). Text prompts are encoded
//! with the tokenizer's special tokens (its post-processor, as Hugging Face's `encode` does);
//! a rendered chat is encoded without them (the template wrote them).

use std::path::{Path, PathBuf};

use tandem_model::chat::{ChatTemplate, Message};
use tandem_model::tokens::special_ids;
use tokenizers::Tokenizer;

use crate::error::ServeError;

/// ChatML, for models that ship no template.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
                      message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if \
                      add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The model directory's text files.
pub struct ModelText {
    /// The directory.
    pub dir: PathBuf,
    tk: Option<Tokenizer>,
    /// Stop ids (EOS of `generation_config.json`, else `config.json`).
    pub eos: Vec<u32>,
    chat: ChatTemplate,
    /// Whether the template came from the model (else ChatML).
    pub own_template: bool,
    /// `vocab_size` of `config.json`.
    pub vocab: Option<usize>,
}

impl ModelText {
    /// Reads `dir`'s tokenizer, special ids and chat template.
    pub fn load(dir: &Path) -> Result<ModelText, ServeError> {
        let (bos, eos) = special_ids(dir)?;
        let tk = Tokenizer::from_file(dir.join("tokenizer.json")).ok();
        let own = tk
            .as_ref()
            .and_then(|tk| ChatTemplate::load(dir, tk, bos, eos.first().copied()).ok());
        let own_template = own.is_some();
        let name = |id: Option<u32>| {
            id.and_then(|i| tk.as_ref().and_then(|tk| tk.id_to_token(i)))
                .unwrap_or_default()
        };
        let chat = own
            .unwrap_or_else(|| ChatTemplate::new(CHATML, &name(bos), &name(eos.first().copied())));
        let vocab = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|c| c.get("vocab_size").and_then(serde_json::Value::as_u64))
            .map(|v| v as usize);
        Ok(ModelText {
            vocab,
            dir: dir.to_path_buf(),
            tk,
            eos,
            chat,
            own_template,
        })
    }

    fn tokenizer(&self) -> Result<&Tokenizer, String> {
        self.tk.as_ref().ok_or_else(|| {
            format!(
                "{} has no tokenizer.json: send token ids instead of text",
                self.dir.display()
            )
        })
    }

    /// Token ids of a text prompt (with the tokenizer's special tokens).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, String> {
        self.tokenizer()?
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("encoding the prompt: {e}"))
    }

    /// Why `prompt` cannot be generated from with `context` tokens of room, if it cannot
    /// (checked before batching: one bad prompt must not fail a shared engine call).
    pub fn check(&self, prompt: &[u32], context: usize) -> Result<(), String> {
        if prompt.is_empty() {
            return Err("the prompt is empty".into());
        }
        if prompt.len() >= context {
            return Err(format!(
                "the prompt has {} tokens; the context length is {context}",
                prompt.len()
            ));
        }
        if let (Some(v), Some(bad)) = (
            self.vocab,
            prompt
                .iter()
                .find(|&&t| t as usize >= self.vocab.unwrap_or(0)),
        ) {
            return Err(format!(
                "token id {bad} is outside the vocabulary (size {v})"
            ));
        }
        Ok(())
    }

    /// Text of `ids`; empty when the model has no tokenizer.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        self.tk
            .as_ref()
            .and_then(|tk| tk.decode(ids, skip_special).ok())
            .unwrap_or_default()
    }

    /// The text of one token (special tokens included), as logprob entries name it.
    pub fn token(&self, id: u32) -> String {
        self.decode(&[id], false)
    }

    /// Token ids of a conversation rendered through the chat template with the assistant's
    /// turn opened.
    pub fn chat(&self, messages: &[Message]) -> Result<Vec<u32>, String> {
        let text = self.chat.render(messages).map_err(|e| e.to_string())?;
        self.encode(&text, false)
    }
}

/// Decodes a growing token list into text deltas, holding back an incomplete UTF-8 tail.
#[derive(Default)]
pub struct Incremental {
    ids: Vec<u32>,
    sent: usize,
}

impl Incremental {
    /// Adds tokens; returns the new text (possibly empty).
    pub fn push(&mut self, text: &ModelText, ids: &[u32], skip_special: bool) -> String {
        self.ids.extend_from_slice(ids);
        let full = text.decode(&self.ids, skip_special);
        if full.ends_with('\u{FFFD}') || full.len() < self.sent || !full.is_char_boundary(self.sent)
        {
            return String::new();
        }
        let delta = full[self.sent..].to_owned();
        self.sent = full.len();
        delta
    }

    /// Whatever is left at the end.
    pub fn finish(&mut self, text: &ModelText, skip_special: bool) -> String {
        let full = text.decode(&self.ids, skip_special);
        let delta = full.get(self.sent..).unwrap_or_default().to_owned();
        self.sent = full.len();
        delta
    }
}
