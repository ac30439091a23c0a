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
use crate::turns::ToolUse;
use std::path::Path;
use tandem_model::chat::{ChatTemplate, Message};
use tandem_model::tokens::special_ids;
use tandem_model::tools::ToolFamily;
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
    tools: Option<ToolUse>,
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
            tools: None,
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

    /// The codec of a job's `[environment]` (`chat`, `system`, `tools`). With tools the
    /// template must render a tool turn append-only (one line naming the template and the
    /// turn otherwise), and the system message gains the tools' instructions.
    pub fn for_env(model: &Path, env: &EnvironmentSection) -> Result<PromptCodec, RlError> {
        let mut codec = PromptCodec::load_with(model, env.chat, env.system.as_deref())?;
        if env.tools.is_empty() {
            return Ok(codec);
        }
        let Some(chat) = &mut codec.chat else {
            return Err(
                RlError::usage("[environment] tools need chat prompts: a tool's answer is a                                 message of the chat template")
                .with_help("set chat = true in [environment]"),
            );
        };
        let Some(tools) = ToolUse::of(env, chat.template.source())? else {
            return Ok(codec);
        };
        chat.template
            .check_append_only(&codec.tk, &tool_probe(tools.family()))
            .map_err(RlError::from)?;
        let text = tools.instructions();
        chat.system = Some(match chat.system.take() {
            Some(s) => format!("{s}\n\n{text}"),
            None => text,
        });
        codec.tools = Some(tools);
        Ok(codec)
    }

    /// How rollouts use tools (`None`: single-turn).
    pub fn tools(&self) -> Option<&ToolUse> {
        self.tools.as_ref()
    }

    /// The ids between an assistant turn whose decoded text is `text` (ended by the engine's
    /// stop token `stop`) and the next assistant turn, after the tool messages `tools`: the
    /// rest of the template's close of the turn, the messages, the next assistant header.
    /// Rendered on their own (the engine's tokens are never re-encoded); an error when the
    /// template does not keep `text` verbatim or closes the turn with something other than
    /// the stop token.
    pub fn between_turns(
        &self,
        text: &str,
        stop: Option<u32>,
        tools: &[Message],
    ) -> Result<Vec<u32>, RlError> {
        let chat = self
            .chat
            .as_ref()
            .ok_or_else(|| RlError::failed("tool turns need chat prompts"))?;
        let t = &chat.template;
        let mut h = Vec::with_capacity(3 + tools.len());
        if let Some(s) = &chat.system {
            h.push(Message::new("system", s));
        }
        h.push(Message::new("user", "?"));
        let opened = t.render_turns(&h, true)?;
        h.push(Message::new("assistant", text));
        let closed = t.render_turns(&h, false)?;
        let misaligned = |what: String| {
            RlError::usage(format!("chat template: {what}")).with_help(
                "multi-turn rollouts keep the engine's tokens and render only what comes \
                 between turns: use a template that renders an assistant message verbatim",
            )
        };
        let close = closed
            .strip_prefix(opened.as_str())
            .and_then(|r| r.strip_prefix(text))
            .ok_or_else(|| misaligned("it does not render the assistant's text verbatim".into()))?;
        let close = match stop.filter(|id| self.eos.contains(id)) {
            Some(id) => {
                let stop_text = self
                    .tk
                    .decode(&[id], false)
                    .map_err(|e| RlError::failed(format!("decoding stop token {id}: {e}")))?;
                close.strip_prefix(stop_text.as_str()).ok_or_else(|| {
                    misaligned(format!(
                        "it closes an assistant turn with {close:?}, the engine stops at \
                         {stop_text:?}"
                    ))
                })?
            }
            None => close,
        };
        h.extend(tools.iter().cloned());
        let next = t.render_turns(&h, true)?;
        let added = next.strip_prefix(closed.as_str()).ok_or_else(|| {
            misaligned("a tool message rewrites the turns before it (not append-only)".into())
        })?;
        self.encode(&format!("{close}{added}"))
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

/// The conversation the append-only check renders for a run with tools: an assistant turn
/// with a call in `family`'s format, the tool's answer, the final answer.
fn tool_probe(family: ToolFamily) -> Vec<Message> {
    let call = match family {
        ToolFamily::Hermes => {
            "<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"12 + 30\"}}\n</tool_call>"
        }
        ToolFamily::Llama3 => {
            "{\"name\": \"calculate\", \"parameters\": {\"expression\": \"12 + 30\"}}"
        }
    };
    vec![
        Message::new("system", "You answer with a number."),
        Message::new("user", "What is 12 + 30?"),
        Message::new("assistant", call),
        family.tool_message("42"),
        Message::new("assistant", "12 + 30 = 42."),
        Message::new("user", "Thanks."),
    ]
}

#[cfg(test)]
pub(crate) mod tests;
