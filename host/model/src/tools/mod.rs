//! Tool use in the model's own format: which tool-call format a chat template teaches
//! ([`ToolFamily`]), the calls read out of a completion ([`parse`]), the tool's answer as the
//! message the template renders ([`ToolFamily::tool_message`]), and the built-in tools, run by
//! [`run_builtin`]: the calculator ([`calculate`]) and Python in a sandbox ([`sandbox`]).
//!
//! Families, detected from the template text (first match wins), or named by the user:
//!
//! - `hermes` (Qwen2.5, Qwen3, Hermes 2 Pro / 3), detected by `<tool_call>`: a call is
//!   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; a tool's answer is a `tool`
//!   message, which the template wraps in `<tool_response>`.
//! - `llama3` (Llama 3.1 / 3.2 / 3.3), detected by `<|python_tag|>`, or by `"parameters"`
//!   together with an `ipython` role: a call is `{"name": ..., "parameters": {...}}`, optionally
//!   after `<|python_tag|>` and ended by `<|eom_id|>`; a tool's answer is an `ipython` message
//!   (Llama 3.1's template renders a string answer through `tojson`, so `1000` appears as
//!   `"1000"`, in `transformers` as here).
//!
//! Not supported (detection gives `None`, and naming them is an error): Mistral's
//! `[TOOL_CALLS]`, Llama 4 / pythonic `[f(x=1)]` lists, Qwen3-Coder's XML `<function=...>`,
//! DeepSeek's `<｜tool▁calls▁begin｜>`, Granite's and Phi-4's `<|tool_call|>`, Gemma, and
//! Llama 3's built-in tools (`brave_search.call(...)` code after `<|python_tag|>` is read as a
//! malformed call). Templates without tool support at all (SmolLM2-Instruct's ChatML, the tiny
//! preset, which has no template) are `None` too: name a family to train such a model to
//! write that format.
//!
//! The calls are read from the engine's text and the tool message is rendered as a new turn
//! through [`crate::chat`]; the tokens the engine produced are never re-rendered. One Qwen2.5
//! property matters for token-exact multi-turn: consecutive `tool` messages share one `user`
//! turn whose `<|im_end|>` is written after the last of them, so a turn's tool messages must
//! be rendered together (rendering them one at a time is not append-only; see the tests).

mod calc;
mod error;
mod parse;
pub mod sandbox;

pub use calc::{MAX_DEPTH, MAX_EXPONENT, MAX_LEN, calculate};
pub use error::ToolError;
pub use parse::{ParsedCall, parse};
pub use sandbox::{Isolation, SandboxLimits, isolation, run_python};

use crate::chat::Message;
use serde_json::{Value, json};

/// A tool-call format, as a chat-template family writes it (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolFamily {
    /// `<tool_call>` JSON blocks; answers in role `tool` (Qwen2.5, Qwen3, Hermes).
    Hermes,
    /// A bare JSON object with `"parameters"`; answers in role `ipython` (Llama 3.x).
    Llama3,
}

impl ToolFamily {
    /// The family a chat template's text teaches, or `None` when it teaches none supported.
    pub fn detect(template: &str) -> Option<ToolFamily> {
        // Qwen3-Coder also wraps its calls in `<tool_call>`, but as XML `<function=...>`.
        if template.contains("<function=") {
            None
        } else if template.contains("<tool_call>") {
            Some(ToolFamily::Hermes)
        } else if template.contains("<|python_tag|>")
            || (template.contains("\"parameters\"") && template.contains("ipython"))
        {
            Some(ToolFamily::Llama3)
        } else {
            None
        }
    }

    /// The family called `name`: `hermes` (also `qwen`, `qwen2.5`, `qwen3`) or `llama3`
    /// (also `llama3.1`, `llama3.2`, `llama3.3`); case-insensitive.
    pub fn from_name(name: &str) -> Result<ToolFamily, ToolError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "hermes" | "qwen" | "qwen2.5" | "qwen3" => Ok(ToolFamily::Hermes),
            "llama3" | "llama3.1" | "llama3.2" | "llama3.3" => Ok(ToolFamily::Llama3),
            _ => Err(ToolError::UnknownFamily {
                name: name.to_owned(),
            }),
        }
    }

    /// The family named by `name` if given (it overrides the template), else the one
    /// `template` teaches, else [`ToolError::NoFamily`].
    pub fn resolve(template: &str, name: Option<&str>) -> Result<ToolFamily, ToolError> {
        match name {
            Some(n) => ToolFamily::from_name(n),
            None => ToolFamily::detect(template).ok_or(ToolError::NoFamily),
        }
    }

    /// The family's canonical name (what [`ToolFamily::from_name`] reads back).
    pub fn name(self) -> &'static str {
        match self {
            ToolFamily::Hermes => "hermes",
            ToolFamily::Llama3 => "llama3",
        }
    }

    /// The role the family's templates render a tool's answer under.
    pub fn tool_role(self) -> &'static str {
        match self {
            ToolFamily::Hermes => "tool",
            ToolFamily::Llama3 => "ipython",
        }
    }

    /// A tool's answer as the message the template renders (the template adds the wrapping:
    /// `<tool_response>` for Qwen/Hermes, the `ipython` header for Llama 3).
    pub fn tool_message(self, content: &str) -> Message {
        Message::new(self.tool_role(), content)
    }

    /// A tool's result as its message: the answer, or `error: <the error's line>`.
    pub fn result_message(self, result: &Result<String, ToolError>) -> Message {
        match result {
            Ok(answer) => self.tool_message(answer),
            Err(e) => self.tool_message(&format!("error: {e}")),
        }
    }

    /// The tool calls in `text` (see [`parse`]).
    pub fn parse(self, text: &str) -> Vec<ParsedCall> {
        parse(self, text)
    }
}

impl std::fmt::Display for ToolFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The built-in tools' names.
pub const BUILTIN_TOOLS: [&str; 2] = ["calculate", "python"];

/// The calculator's declaration as a JSON-schema function (the form tool-aware templates list
/// under `tools`, and what a system prompt can show the model).
pub fn calculator_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression exactly: + - * / ^, parentheses, \
                            decimals. Returns an integer, an exact decimal, or a fraction p/q.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": "The expression, e.g. \"(3 + 4) * 2^5\"."
                    }
                },
                "required": ["expression"]
            }
        }
    })
}

/// Runs the built-in tool `name` on `arguments` (the object a [`ParsedCall::Call`] holds):
/// `calculate` takes `{"expression": "<string>"}`, `python` takes `{"code": "<source>"}`
/// (run in [`sandbox`] with its default limits; what it prints is the answer).
pub fn run_builtin(name: &str, arguments: &Value) -> Result<String, ToolError> {
    match name {
        "calculate" => {
            let expression = arguments
                .get("expression")
                .and_then(Value::as_str)
                .ok_or_else(|| ToolError::BadArguments {
                    tool: name.to_owned(),
                    reason: "expected {\"expression\": \"<arithmetic as a string>\"}".to_owned(),
                })?;
            calculate(expression)
        }
        "python" => {
            let code = arguments
                .get("code")
                .and_then(Value::as_str)
                .ok_or_else(|| ToolError::BadArguments {
                    tool: name.to_owned(),
                    reason: "expected {\"code\": \"<Python source>\"}".to_owned(),
                })?;
            sandbox::run_python(code, &SandboxLimits::default())
        }
        _ => Err(ToolError::UnknownTool {
            name: name.to_owned(),
            offered: BUILTIN_TOOLS.join(", "),
        }),
    }
}

#[cfg(test)]
mod tests;
