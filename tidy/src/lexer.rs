//! A small Rust scanner: splits a source file into code (comments removed, literal contents
//! blanked) and string literals (with their lines).
//!
//! It knows line and (nested) block comments, string literals with escapes, raw strings
//! (`r"…"`, `r#"…"#`, also after `b` / `c`), and character literals as opposed to lifetimes.
//! It does not parse Rust; it is as good as the source rules need.

/// A string literal of a source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrLit {
    /// The 1-based line of its opening quote.
    pub line: usize,
    /// Its contents as written, between the quotes (escapes not processed).
    pub text: String,
}

/// A scanned source file.
#[derive(Debug, Default)]
pub struct Scanned {
    /// The code, with comments removed and the contents of string and character literals
    /// blanked; newlines are kept, so line `n` of the file is line `n` here.
    pub code: String,
    /// Every string literal, in order.
    pub strings: Vec<StrLit>,
}

/// Scans `src`.
pub fn scan(src: &str) -> Scanned {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Scanned::default();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = block_comment(&chars, i, &mut out.code, &mut line);
        } else if c == '"' {
            i = string(&chars, i + 1, None, &mut out, &mut line);
        } else if let Some((hashes, quote)) = raw_string_start(&chars, i) {
            out.code.push('r');
            i = string(&chars, quote + 1, Some(hashes), &mut out, &mut line);
        } else if c == '\'' {
            i = char_or_lifetime(&chars, i, &mut out.code);
        } else {
            if c == '\n' {
                line += 1;
            }
            out.code.push(c);
            i += 1;
        }
    }
    out
}

/// Skips a block comment starting at `start` (`/*`), nested ones included; returns the index
/// after it. Keeps its newlines in `code`.
fn block_comment(chars: &[char], start: usize, code: &mut String, line: &mut usize) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        let pair = (chars[i], chars.get(i + 1).copied());
        match pair {
            ('/', Some('*')) => {
                depth += 1;
                i += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            ('\n', _) => {
                code.push('\n');
                *line += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

/// Whether a raw string starts at `i` (`r"`, `r#"`, ...; `br` and `cr` included): the number
/// of `#` and the index of the opening quote.
fn raw_string_start(chars: &[char], i: usize) -> Option<(usize, usize)> {
    if chars[i] != 'r' {
        return None;
    }
    let before = i.checked_sub(1).map(|j| chars[j]);
    let prefix_ok = match before {
        None => true,
        Some('b' | 'c') => i < 2 || !is_ident(chars[i - 2]),
        Some(b) => !is_ident(b),
    };
    if !prefix_ok {
        return None;
    }
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some((j - i - 1, j))
}

/// Reads a string literal whose contents start at `start`; `raw` is the number of `#` of a raw
/// string (no escapes; it ends at `"` followed by that many `#`). Returns the index after it.
fn string(
    chars: &[char],
    start: usize,
    raw: Option<usize>,
    out: &mut Scanned,
    line: &mut usize,
) -> usize {
    let hashes = raw.unwrap_or(0);
    out.code.push('"');
    let mut lit = StrLit {
        line: *line,
        text: String::new(),
    };
    let mut i = start;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' && raw.is_none() {
            lit.text.push(c);
            if let Some(&e) = chars.get(i + 1) {
                lit.text.push(e);
                if e == '\n' {
                    out.code.push('\n');
                    *line += 1;
                }
            }
            i += 2;
            continue;
        }
        if c == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
            i += 1 + hashes;
            break;
        }
        if c == '\n' {
            out.code.push('\n');
            *line += 1;
        }
        lit.text.push(c);
        i += 1;
    }
    out.code.push('"');
    out.strings.push(lit);
    i
}

/// Reads a character literal (`'x'`, `'\n'`, `'\u{..}'`) or a lifetime / label at `start`;
/// returns the index after it. A character literal becomes `' '` in `code`.
fn char_or_lifetime(chars: &[char], start: usize, code: &mut String) -> usize {
    let next = chars.get(start + 1).copied();
    if next == Some('\\') {
        let mut i = start + 3;
        while i < chars.len() && chars[i] != '\'' && chars[i] != '\n' {
            i += 1;
        }
        code.push_str("' '");
        return i + 1;
    }
    if next.is_some_and(|n| n != '\n') && chars.get(start + 2) == Some(&'\'') {
        code.push_str("' '");
        return start + 3;
    }
    code.push('\'');
    start + 1
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[cfg(test)]
#[path = "lexer_tests.rs"]
mod tests;
