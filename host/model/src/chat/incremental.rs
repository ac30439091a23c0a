//! Whether a chat template renders a conversation *append-only*: each turn's rendering is the
//! previous one with text added at the end, and tokenizing the added pieces one by one gives
//! the same ids as tokenizing the whole. Multi-turn RL needs both: the tokens the engine
//! produced are kept as they are and each new message is rendered and tokenized on its own,
//! so a template that rewrites earlier turns (one that drops past reasoning, say) or a
//! boundary a tokenizer merges across would train on ids the model never saw together.
//!
//! [`ChatTemplate::check_append_only`] renders every prefix of a probe conversation
//! (system, user, assistant, user with a tool-like payload, assistant, user) — with the
//! generation prompt where the assistant speaks next — and reports the first turn where the
//! property fails, as one [`ModelError::Invalid`] line naming the template file.

use super::{ChatTemplate, Message};
use crate::error::{ModelError, Result};
use tokenizers::Tokenizer;

/// The conversation the check renders turn by turn.
pub fn probe_conversation() -> Vec<Message> {
    vec![
        Message::new("system", "You answer with a number."),
        Message::new("user", "What is 12 + 30?"),
        Message::new("assistant", "I add them: 12 + 30 = 42."),
        Message::new("user", "The calculator says: {\"result\": 42}. And 42 * 2?"),
        Message::new("assistant", "42 * 2 = 84."),
        Message::new("user", "Thanks."),
    ]
}

/// What the check found: the renderings of each prefix and their token counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendOnly {
    /// Turns rendered.
    pub turns: usize,
    /// Tokens of the whole conversation's rendering.
    pub tokens: usize,
}

impl ChatTemplate {
    /// Checks that rendering `conversation` turn by turn only ever appends, as text and as
    /// `tk`'s ids (see the module doc); the error names the first turn that does not.
    pub fn check_append_only(
        &self,
        tk: &Tokenizer,
        conversation: &[Message],
    ) -> Result<AppendOnly> {
        let mut prev = String::new();
        let mut ids: Vec<u32> = Vec::new();
        for k in 1..=conversation.len() {
            let opens = conversation.get(k).is_some_and(|m| m.role == "assistant");
            let text = self.render_turns(&conversation[..k], opens)?;
            let Some(added) = text.strip_prefix(prev.as_str()) else {
                let at = first_difference(&prev, &text);
                return Err(self.not_append_only(format!(
                    "turn {k} ({}) rewrites what earlier turns rendered, from character {at}: \
                     {:?} became {:?}",
                    conversation[k - 1].role,
                    excerpt(&prev, at),
                    excerpt(&text, at)
                )));
            };
            ids.extend(encode(tk, added, &self.origin)?);
            let whole = encode(tk, &text, &self.origin)?;
            if whole != ids {
                let at = ids.iter().zip(&whole).take_while(|(a, b)| a == b).count();
                return Err(self.not_append_only(format!(
                    "turn {k} ({}): its text tokenized on its own joins differently with what \
                     came before (token {at} of the whole: {:?} vs {:?})",
                    conversation[k - 1].role,
                    whole.get(at),
                    ids.get(at)
                )));
            }
            prev = text;
        }
        Ok(AppendOnly {
            turns: conversation.len(),
            tokens: ids.len(),
        })
    }

    fn not_append_only(&self, what: String) -> ModelError {
        ModelError::invalid(
            &self.origin,
            format!("chat template is not append-only: {what}"),
        )
        .with_help(
            "multi-turn training keeps the engine's tokens and renders each new message on \
                 its own: use a template that never rewrites earlier turns (e.g. one that keeps \
                 past reasoning) for multi-turn environments",
        )
    }
}

fn encode(tk: &Tokenizer, text: &str, origin: &std::path::Path) -> Result<Vec<u32>> {
    tk.encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| ModelError::invalid(origin, format!("tokenizing a rendered turn: {e}")))
}

/// The first character index where `a` and `b` differ.
fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

/// Up to 24 characters of `s` from character `at`.
fn excerpt(s: &str, at: usize) -> String {
    s.chars().skip(at).take(24).collect()
}
