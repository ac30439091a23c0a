//! A server's error body as one line for a plugin's error message: the message out of the
//! JSON shapes Python inference servers answer with (`{"error": {"message"}}`,
//! `{"error": "..."}`, `{"message"}`, `{"error_message"}`, FastAPI's `{"detail"}`), else the
//! body's text; whitespace folded, at most [`MAX_QUOTE`] bytes.

use serde_json::Value;

/// The longest quote, in bytes (an ellipsis marks a cut).
pub const MAX_QUOTE: usize = 400;

/// The message of an error `body` on one line.
pub fn error_message(body: &str) -> String {
    let msg = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("error").filter(|e| e.is_string()))
                .or_else(|| v.get("message"))
                .or_else(|| v.get("error_message"))
                .or_else(|| v.get("detail"))
                .map(|m| match m {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
        })
        .unwrap_or_else(|| body.trim().to_owned());
    let one_line = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.len() > MAX_QUOTE {
        let mut end = MAX_QUOTE;
        while !one_line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &one_line[..end])
    } else {
        one_line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_gives_its_message_on_one_line() {
        assert_eq!(error_message(r#"{"error":{"message":"a\n b"}}"#), "a b");
        assert_eq!(error_message(r#"{"error":"bad key"}"#), "bad key");
        assert_eq!(error_message(r#"{"object":"error","message":"m"}"#), "m");
        assert_eq!(
            error_message(r#"{"success":false,"error_message":"e"}"#),
            "e"
        );
        assert_eq!(error_message(r#"{"detail":[{"loc":1}]}"#), r#"[{"loc":1}]"#);
        assert_eq!(error_message("  plain\ttext "), "plain text");
        let long = "é".repeat(MAX_QUOTE);
        let q = error_message(&long);
        assert!(q.ends_with('…') && q.len() <= MAX_QUOTE + '…'.len_utf8());
    }
}
