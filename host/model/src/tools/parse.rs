//! Tool calls read out of a completion's text, in the format of the model's template family.
//!
//! - [`ToolFamily::Hermes`] (Qwen2.5, Qwen3, Hermes 2 Pro / 3): every
//!   `<tool_call>` … `</tool_call>` block anywhere in the text holds one JSON object
//!   `{"name": "...", "arguments": {...}}`; several blocks are several calls.
//! - [`ToolFamily::Llama3`] (Llama 3.1 / 3.2 / 3.3 JSON tool calling): the message *is* the
//!   call — it starts (after whitespace) with `{` or `<|python_tag|>` — and holds one or more
//!   JSON objects `{"name": "...", "parameters": {...}}` (`"arguments"` is read too), separated
//!   by whitespace or `;`, each may carry its own `<|python_tag|>`, up to `<|eom_id|>` /
//!   `<|eot_id|>` if the text still carries one, else the end. A message that starts with
//!   prose is an answer, not a call (a `<|python_tag|>` later in it still opens one).
//!
//! Nothing is dropped: every opened call comes back, in text order, either as
//! [`ParsedCall::Call`] or as [`ParsedCall::Malformed`] with a one-line reason — invalid JSON,
//! not an object, no `"name"` string, no arguments object, an unclosed `<tool_call>`, a stray
//! `</tool_call>`, text after a Llama 3 call that is not another call — so that an
//! environment can reward well-formed calls. Spans are byte ranges of the text: the whole
//! block with its tags for Hermes; from `<|python_tag|>` (or `{`) to the object's `}` for
//! Llama 3. Arguments must be a JSON object; a JSON-encoded string of one is malformed (the
//! templates render an object, and the format the model is taught is the object).

use super::ToolFamily;
use serde_json::Value;
use std::ops::Range;

/// One tool call read from a completion, or the text of one that could not be read.
#[derive(Debug, Clone, PartialEq)]
pub enum ParsedCall {
    /// A well-formed call.
    Call {
        /// The tool's name.
        name: String,
        /// The arguments object.
        arguments: Value,
        /// The call's bytes in the completion.
        span: Range<usize>,
    },
    /// An attempted call that is not well formed.
    Malformed {
        /// The attempt's bytes in the completion.
        span: Range<usize>,
        /// Why it is malformed, one line.
        reason: String,
    },
}

impl ParsedCall {
    /// The call's bytes in the completion.
    pub fn span(&self) -> &Range<usize> {
        match self {
            ParsedCall::Call { span, .. } | ParsedCall::Malformed { span, .. } => span,
        }
    }

    /// Whether the call is well formed.
    pub fn is_well_formed(&self) -> bool {
        matches!(self, ParsedCall::Call { .. })
    }
}

/// The tool calls in `text`, a completion of a model of `family` (see the module doc).
pub fn parse(family: ToolFamily, text: &str) -> Vec<ParsedCall> {
    match family {
        ToolFamily::Hermes => parse_hermes(text),
        ToolFamily::Llama3 => parse_llama3(text),
    }
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const LLAMA_ENDS: [&str; 2] = ["<|eom_id|>", "<|eot_id|>"];

/// The position of `pat` in `text` at or after `from`.
fn find_from(text: &str, from: usize, pat: &str) -> Option<usize> {
    text[from..].find(pat).map(|i| i + from)
}

fn parse_hermes(text: &str) -> Vec<ParsedCall> {
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        let open = find_from(text, pos, OPEN).map(|o| (o, true));
        let close = find_from(text, pos, CLOSE).map(|c| (c, false));
        match open.into_iter().chain(close).min() {
            None => return out,
            Some((c, false)) => {
                out.push(ParsedCall::Malformed {
                    span: c..c + CLOSE.len(),
                    reason: "`</tool_call>` without an opening `<tool_call>`".to_owned(),
                });
                pos = c + CLOSE.len();
            }
            Some((o, true)) => {
                let body = o + OPEN.len();
                let close = find_from(text, body, CLOSE);
                let reopen = find_from(text, body, OPEN);
                match close {
                    Some(c) if reopen.is_none_or(|r| c < r) => {
                        let end = c + CLOSE.len();
                        out.push(call_from_json(&text[body..c], o..end, &["arguments"]));
                        pos = end;
                    }
                    _ => {
                        let (end, before) = match reopen {
                            Some(r) => (r, "the next `<tool_call>`"),
                            None => (text.len(), "the end of the text"),
                        };
                        out.push(ParsedCall::Malformed {
                            span: o..end,
                            reason: format!(
                                "unclosed `<tool_call>`: no `</tool_call>` before {before}"
                            ),
                        });
                        pos = end;
                    }
                }
            }
        }
    }
}

fn parse_llama3(text: &str) -> Vec<ParsedCall> {
    let lead = text.len() - text.trim_start().len();
    let mut pos = if text[lead..].starts_with('{') {
        lead
    } else if let Some(t) = text.find(PYTHON_TAG) {
        t
    } else {
        return Vec::new();
    };
    let end = LLAMA_ENDS
        .iter()
        .filter_map(|e| find_from(text, pos, e))
        .min()
        .unwrap_or(text.len());
    let skip_space = |mut pos: usize| {
        while text[pos..end].starts_with(|c: char| c.is_whitespace() || c == ';') {
            pos += text[pos..].chars().next().map_or(1, char::len_utf8);
        }
        pos
    };
    let mut out = Vec::new();
    loop {
        pos = skip_space(pos);
        if pos >= end {
            return out;
        }
        let span_start = pos;
        if text[pos..end].starts_with(PYTHON_TAG) {
            pos = skip_space(pos + PYTHON_TAG.len());
            if pos >= end {
                out.push(ParsedCall::Malformed {
                    span: span_start..end,
                    reason: "`<|python_tag|>` with no call after it".to_owned(),
                });
                return out;
            }
        }
        let region = &text[pos..end];
        if !region.starts_with('{') {
            out.push(ParsedCall::Malformed {
                span: span_start..end,
                reason: "expected a JSON object `{\"name\": ..., \"parameters\": {...}}` \
                         (built-in tool code calls are not supported)"
                    .to_owned(),
            });
            return out;
        }
        let mut stream = serde_json::Deserializer::from_str(region).into_iter::<Value>();
        match stream.next() {
            Some(Ok(_)) => {
                let json_end = pos + stream.byte_offset();
                out.push(call_from_json(
                    &text[pos..json_end],
                    span_start..json_end,
                    &["parameters", "arguments"],
                ));
                pos = json_end;
            }
            Some(Err(e)) => {
                out.push(malformed_json(span_start..end, &e));
                return out;
            }
            None => return out,
        }
    }
}

fn malformed_json(span: Range<usize>, e: &serde_json::Error) -> ParsedCall {
    ParsedCall::Malformed {
        span,
        reason: format!("not valid JSON: {e}"),
    }
}

/// The call in `body` (one JSON object), its arguments under the first of `keys` present.
fn call_from_json(body: &str, span: Range<usize>, keys: &[&str]) -> ParsedCall {
    let bad = |reason: String| ParsedCall::Malformed {
        span: span.clone(),
        reason,
    };
    let value: Value = match serde_json::from_str(body.trim()) {
        Ok(v) => v,
        Err(e) => return malformed_json(span.clone(), &e),
    };
    let Value::Object(mut object) = value else {
        return bad("the call is not a JSON object".to_owned());
    };
    let name = match object.get("name") {
        Some(Value::String(n)) if !n.trim().is_empty() => n.clone(),
        Some(Value::String(_)) => return bad("the call's \"name\" is empty".to_owned()),
        Some(_) => return bad("the call's \"name\" is not a string".to_owned()),
        None => return bad("the call has no \"name\"".to_owned()),
    };
    let Some(key) = keys.iter().find(|k| object.contains_key(**k)) else {
        return bad(format!("the call has no \"{}\" object", keys[0]));
    };
    match object.remove(*key) {
        Some(arguments @ Value::Object(_)) => ParsedCall::Call {
            name,
            arguments,
            span,
        },
        _ => bad(format!("the call's \"{key}\" is not a JSON object")),
    }
}
