//! Chat templates: the Jinja template a chat model's prompts are rendered through, read from
//! its model directory and rendered the way Hugging Face `apply_chat_template` renders it.
//!
//! Where the template comes from, first found wins: `chat_template.jinja` in the model
//! directory (what recent `transformers` save, and what they prefer on load), else
//! `tokenizer_config.json`'s `chat_template` — a string, or a list of `{name, template}`
//! of which the one named `default` is taken. `bos_token` / `eos_token` come from
//! `tokenizer_config.json` (a string or an added-token object with `content`), else from the
//! tokenizer's tokens for the ids in `config.json`.
//!
//! Rendering matches `transformers`' sandboxed Jinja environment: `trim_blocks` and
//! `lstrip_blocks` on, a single trailing newline of the template dropped, `{% break %}` /
//! `{% continue %}`, `raise_exception(msg)` failing the render with `msg`, Python string and
//! dict methods (`.strip()`, `.items()`, ...) through `minijinja-contrib`'s `pycompat`. The
//! variables are `messages` (`[{role, content}]`), `add_generation_prompt`, `bos_token` and
//! `eos_token`.
//!
//! Errors are [`ModelError::Invalid`] naming the file (or the model directory, when it has no
//! template), with help that says how to fix the model; a caller that can prompt without the
//! template (`tandem-rl`'s `[task] chat = false`) adds its own help with
//! [`ModelError::with_help`].

use crate::error::{ModelError, Result};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value, context};
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message of `role` with `content`.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

/// A model's chat template with the special-token strings it may use.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    /// The file the template was read from (for messages).
    origin: PathBuf,
}

impl ChatTemplate {
    /// A template from its source text and the `bos_token` / `eos_token` strings.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> ChatTemplate {
        ChatTemplate {
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            origin: PathBuf::from("<template>"),
        }
    }

    /// The template of the model in `model` (see the module doc); `tk` and the `config.json`
    /// ids name the special tokens when `tokenizer_config.json` does not. A model without a
    /// template is one error naming the directory.
    pub fn load(
        model: &Path,
        tk: &Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Result<ChatTemplate> {
        let config_path = model.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| ModelError::invalid(&config_path, e.to_string()))?,
            Err(_) => serde_json::Value::Null,
        };
        let jinja = model.join("chat_template.jinja");
        let (source, origin) = if let Ok(text) = std::fs::read_to_string(&jinja) {
            (text, jinja)
        } else if let Some(text) = from_config(&config) {
            (text, config_path)
        } else {
            return Err(missing(model));
        };
        let token = |key: &str, id: Option<u32>| {
            special_token(&config, key)
                .or_else(|| id.and_then(|i| tk.id_to_token(i)))
                .unwrap_or_default()
        };
        Ok(ChatTemplate {
            source,
            bos_token: token("bos_token", bos),
            eos_token: token("eos_token", eos),
            origin,
        })
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text of `messages` followed by the assistant's turn (`add_generation_prompt`).
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        self.render_turns(messages, true)
    }

    /// The text of `messages`, the assistant's turn opened when `add_generation_prompt`.
    pub fn render_turns(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let bad = |e: Error| {
            ModelError::invalid(&self.origin, format!("chat template: {}", one_line(&e)))
                .with_help("fix the template")
        };
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(bad)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        let template = env.template_from_str(&self.source).map_err(bad)?;
        template
            .render(context! {
                messages => messages
                    .iter()
                    .map(|m| Value::from_pairs([("role", &m.role), ("content", &m.content)]))
                    .collect::<Vec<_>>(),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(bad)
    }
}

/// `chat_template` of `tokenizer_config.json`: a string, or the `default` of a named list.
fn from_config(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_owned),
        _ => None,
    }
}

/// A special token's text in `tokenizer_config.json`: a string or `{"content": ...}`.
fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    let v = config.get(key)?;
    v.as_str()
        .or_else(|| v.get("content").and_then(|c| c.as_str()))
        .map(str::to_owned)
}

/// The error of a model without a template.
fn missing(model: &Path) -> ModelError {
    ModelError::invalid(
        model,
        "the model has no chat template (no chat_template.jinja, no \"chat_template\" in \
         tokenizer_config.json)",
    )
    .with_help("add the model's template as chat_template.jinja")
}

/// A minijinja error (its message names the template line) on one line.
fn one_line(e: &Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

mod incremental;

pub use incremental::{AppendOnly, probe_conversation};

#[cfg(test)]
mod tests;
