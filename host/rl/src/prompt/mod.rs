//! Text ↔ token ids on the controller side: prompts get the model's BOS (plain text) or are
//! rendered through the model's chat template (`[task] chat = true`, see
//! [`tandem_model::chat`]), generation stops at the model's EOS ids
//! ([`tandem_model::tokens::special_ids`]), and decoded completions drop special tokens.
//!
//! A chat prompt is `[system (when given), user: the problem]` with the assistant's turn
//! opened, encoded without adding BOS (the template writes what the model expects) and with
//! the tokenizer's added tokens (`<|im_start|>`, ...) matched as single ids. A template error
//! carries this loop's way around it (`[task] chat = false`) as its help.

use crate::config::EnvironmentSection;
use crate::error::RlError;
use std::path::Path;
use tandem_model::chat::{ChatTemplate, Message};
use tandem_model::tokens::special_ids;
use tokenizers::Tokenizer;

/// Help for a model without a chat template.
const NO_TEMPLATE_HELP: &str = "prompt with plain text ([task] chat = false, or no --chat), or \
                                add the model's template as chat_template.jinja";

/// Help for a template that fails to render.
const BAD_TEMPLATE_HELP: &str = "fix the template, or prompt without it ([task] chat = false)";

/// How prompts are rendered: the chat template with an optional system message.
#[derive(Debug, Clone)]
struct Chat {
    template: ChatTemplate,
    system: Option<String>,
}

/// The model's tokenizer plus its BOS / EOS ids, and its chat template for chat prompts.
pub struct PromptCodec {
    tk: Tokenizer,
    bos: Option<u32>,
    eos: Vec<u32>,
    chat: Option<Chat>,
}

impl PromptCodec {
    /// Loads `config.json`, `generation_config.json` and `tokenizer.json` of a Hugging Face
    /// model directory; prompts are plain text after BOS.
    pub fn load(model: &Path) -> Result<PromptCodec, RlError> {
        let (bos, eos) = special_ids(model)?;
        let path = model.join("tokenizer.json");
        let tk = Tokenizer::from_file(&path).map_err(|e| {
            RlError::usage(format!(
                "model {}: loading {}: {e}",
                model.display(),
                path.display()
            ))
            .with_help("the controller needs the model's tokenizer.json")
        })?;
        Ok(PromptCodec {
            tk,
            bos,
            eos,
            chat: None,
        })
    }

    /// [`PromptCodec::load`], with prompts rendered through the model's chat template (with
    /// `system` as the system message) when `chat` is set.
    pub fn load_with(
        model: &Path,
        chat: bool,
        system: Option<&str>,
    ) -> Result<PromptCodec, RlError> {
        let mut codec = PromptCodec::load(model)?;
        if chat {
            let template =
                ChatTemplate::load(model, &codec.tk, codec.bos, codec.eos.first().copied())
                    .map_err(|e| e.with_help(NO_TEMPLATE_HELP))?;
            codec.chat = Some(Chat {
                template,
                system: system.map(str::to_owned),
            });
        }
        Ok(codec)
    }

    /// The codec of a job's `[environment]` (`chat`, `system`).
    pub fn for_env(model: &Path, env: &EnvironmentSection) -> Result<PromptCodec, RlError> {
        PromptCodec::load_with(model, env.chat, env.system.as_deref())
    }

    /// Token ids of a problem's prompt: its text ([`PromptCodec::prompt`]), or its chat
    /// messages rendered through the chat template (after the system message when `system`
    /// is set and the messages have none).
    pub fn prompt_of(&self, problem: &crate::env::Problem) -> Result<Vec<u32>, RlError> {
        let messages = &problem.item.messages;
        if messages.is_empty() {
            return self.prompt(problem.prompt());
        }
        let Some(chat) = &self.chat else {
            return Err(RlError::usage(format!(
                "item `{}` is a chat conversation but prompts are plain text",
                problem.id()
            ))
            .with_help("set chat = true in [environment] (the model needs a chat template)"));
        };
        let mut list = Vec::with_capacity(messages.len() + 1);
        if let Some(system) = &chat.system
            && messages.first().is_none_or(|m| m.role != "system")
        {
            list.push(Message::new("system", system));
        }
        list.extend(
            messages
                .iter()
                .map(|m| Message::new(m.role.as_str(), m.content.as_str())),
        );
        let text = chat
            .template
            .render(&list)
            .map_err(|e| e.with_help(BAD_TEMPLATE_HELP))?;
        self.encode(&text)
    }

    /// Whether prompts go through the chat template.
    pub fn is_chat(&self) -> bool {
        self.chat.is_some()
    }

    /// The prompt text as the model reads it: the rendered conversation (chat), or `text`.
    pub fn render(&self, text: &str) -> Result<String, RlError> {
        let Some(chat) = &self.chat else {
            return Ok(text.to_owned());
        };
        let mut messages = Vec::with_capacity(2);
        if let Some(system) = &chat.system {
            messages.push(Message::new("system", system));
        }
        messages.push(Message::new("user", text));
        Ok(chat
            .template
            .render(&messages)
            .map_err(|e| e.with_help(BAD_TEMPLATE_HELP))?)
    }

    /// Token ids of a prompt: the rendered conversation (chat), or BOS (when the model has
    /// one) then the text.
    pub fn prompt(&self, text: &str) -> Result<Vec<u32>, RlError> {
        if self.chat.is_some() {
            return self.encode(&self.render(text)?);
        }
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    /// Token ids of a supervised completion: the text, then EOS.
    pub fn completion(&self, text: &str) -> Result<Vec<u32>, RlError> {
        let mut ids = self.encode(text)?;
        ids.extend(self.eos.first().copied());
        Ok(ids)
    }

    /// Stop tokens of generation.
    pub fn stop_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Decoded text of completion ids (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String, RlError> {
        self.tk
            .decode(ids, true)
            .map_err(|e| RlError::failed(format!("decoding a completion: {e}")))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, RlError> {
        self.tk
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| RlError::failed(format!("encoding {text:?}: {e}")))
    }
}

#[cfg(test)]
pub(crate) mod tests;
