//! Text extraction shared by the verifiers: the last `\boxed{...}` of a completion and a
//! regex's capture.

/// The content of the last `\boxed{...}` (or `\fbox{...}`) of `text`, braces balanced
/// (`\boxed{\frac{1}{2}}` gives `\frac{1}{2}`); `\boxed 5` (no braces) gives the token after
/// the space. `None` when there is none or its braces do not close.
pub fn last_boxed(text: &str) -> Option<&str> {
    let start = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|cmd| text.rfind(cmd).map(|i| i + cmd.len()))
        .max()?;
    let rest = &text[start..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut depth = 1usize;
        for (i, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(&body[..i]);
                    }
                }
                _ => {}
            }
        }
        return None;
    }
    let rest = rest.strip_prefix(' ')?.trim_start();
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '$')
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// Compiles a verifier pattern: it must have a capture group (`answer` or the first).
pub fn compile(pattern: &str) -> Result<regex::Regex, String> {
    let re = regex::Regex::new(pattern).map_err(|e| {
        format!(
            "not a valid pattern: {}",
            e.to_string().lines().last().unwrap_or("")
        )
    })?;
    if re.captures_len() < 2 {
        return Err("the pattern has no capture group".into());
    }
    Ok(re)
}

/// The capture of the last match of `re` in `text`: group `answer` when the pattern names
/// one, else group 1; `None` when nothing matches or the group did not take part.
pub fn regex_capture<'t>(re: &regex::Regex, text: &'t str) -> Option<&'t str> {
    let caps = re.captures_iter(text).last()?;
    caps.name("answer")
        .or_else(|| caps.get(1))
        .map(|m| m.as_str())
}
