//! Tokens of a scanned source file, for the rules that read a little Rust syntax
//! (`host-names-no-plugin`): identifiers, string literals (by their index in
//! [`Scanned::strings`]) and single punctuation characters, each with its line; and the test
//! code to leave out (items under `#[cfg(test)]`, test files).
//!
//! Like the scanner, it does not parse Rust: numbers read as identifiers, `::` as two `:`.

use std::path::{Component, Path};

use crate::lexer::Scanned;

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword (or a number).
    Ident(String),
    /// A string literal: its index in [`Scanned::strings`].
    Str(usize),
    /// Any other character but whitespace.
    Punct(char),
}

/// A token and its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The token.
    pub tok: Tok,
    /// Its line.
    pub line: usize,
}

impl Token {
    /// Whether this is the identifier `word`.
    pub fn is(&self, word: &str) -> bool {
        matches!(&self.tok, Tok::Ident(w) if w == word)
    }

    /// Whether this is the punctuation `c`.
    pub fn punct(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }

    /// The identifier, if it is one.
    pub fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(w) => Some(w),
            _ => None,
        }
    }
}

/// The prefixes a string literal may carry (`r"…"`, `b"…"`, `br#"…"#`, `c"…"`).
const STRING_PREFIXES: [&str; 5] = ["r", "b", "br", "c", "cr"];

/// The tokens of `scanned`'s code. Each literal's `""` in the code is one [`Tok::Str`]; a
/// prefix written against it (`r`, `b`, ...) is dropped.
pub fn tokenize(scanned: &Scanned) -> Vec<Token> {
    let chars: Vec<char> = scanned.code.chars().collect();
    let mut out: Vec<Token> = Vec::new();
    let (mut line, mut next_str, mut i) = (1, 0, 0);
    // The end of the last identifier, to tell a literal's prefix from a word before it.
    let mut ident_end = usize::MAX;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            out.push(Token {
                tok: Tok::Ident(word),
                line,
            });
            ident_end = i;
        } else if c == '"' {
            let prefixed = out.last().and_then(Token::ident);
            if ident_end == i && prefixed.is_some_and(|p| STRING_PREFIXES.contains(&p)) {
                out.pop();
            }
            out.push(Token {
                tok: Tok::Str(next_str),
                line,
            });
            next_str += 1;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += 1;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// Whether `path` is a test file: `tests.rs`, `*_tests.rs`, or under a `tests` directory.
pub fn is_test_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let in_tests = path.parent().is_some_and(|dir| {
        dir.components()
            .any(|c| c == Component::Normal("tests".as_ref()))
    });
    name == "tests.rs" || name.ends_with("_tests.rs") || in_tests
}

/// `tokens` without test code: each item under `#[cfg(test)]` (with its attributes; a
/// `mod … { … }`, a `fn`, an `impl`, a `mod tests;`), and everything when the file says
/// `#![cfg(test)]`.
pub fn without_tests(tokens: Vec<Token>) -> Vec<Token> {
    let mut keep = vec![true; tokens.len()];
    let mut i = 0;
    while i < tokens.len() {
        match cfg_test_at(&tokens, i) {
            Some((true, _)) => return Vec::new(),
            Some((false, after)) => {
                let end = item_end(&tokens, after);
                keep[i..end].iter_mut().for_each(|k| *k = false);
                i = end;
            }
            None => i += 1,
        }
    }
    tokens
        .into_iter()
        .zip(keep)
        .filter_map(|(t, k)| k.then_some(t))
        .collect()
}

/// Whether `#[cfg(test)]` (or `#![cfg(test)]`: `true`) starts at `i`; the index after it.
fn cfg_test_at(tokens: &[Token], i: usize) -> Option<(bool, usize)> {
    if !tokens[i].punct('#') {
        return None;
    }
    let inner = tokens.get(i + 1).is_some_and(|t| t.punct('!'));
    let j = i + 1 + usize::from(inner);
    let shape: [fn(&Token) -> bool; 6] = [
        |t| t.punct('['),
        |t| t.is("cfg"),
        |t| t.punct('('),
        |t| t.is("test"),
        |t| t.punct(')'),
        |t| t.punct(']'),
    ];
    let fits = shape
        .iter()
        .enumerate()
        .all(|(k, fits)| tokens.get(j + k).is_some_and(fits));
    fits.then_some((inner, j + shape.len()))
}

/// The index after the item starting at `start`: up to its `;` or `,` at depth 0, or the
/// `}` closing its first `{` at depth 0, or before a bracket that closes an enclosing one.
fn item_end(tokens: &[Token], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < tokens.len() {
        let t = &tokens[i];
        if t.punct('(') || t.punct('[') {
            depth += 1;
        } else if t.punct(')') || t.punct(']') || t.punct('}') {
            if depth == 0 {
                return i;
            }
            depth -= 1;
        } else if depth == 0 && (t.punct(';') || t.punct(',')) {
            return i + 1;
        } else if depth == 0 && t.punct('{') {
            return matching(tokens, i).map_or(tokens.len(), |close| close + 1);
        }
        i += 1;
    }
    i
}

/// The index of the bracket closing the one at `open` (`(`, `[` or `{`).
pub fn matching(tokens: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        if t.punct('(') || t.punct('[') || t.punct('{') {
            depth += 1;
        } else if t.punct(')') || t.punct(']') || t.punct('}') {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// Splits `tokens` (the inside of a bracket) at the commas outside any bracket; `angle`:
/// `<…>` counts as a bracket too (types), except the `>` of `->`.
pub fn split_commas(tokens: &[Token], angle: bool) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0isize, 0);
    for (i, t) in tokens.iter().enumerate() {
        let arrow = i > 0 && tokens[i - 1].punct('-');
        if t.punct('(') || t.punct('[') || t.punct('{') || (angle && t.punct('<')) {
            depth += 1;
        } else if t.punct(')') || t.punct(']') || t.punct('}') || (angle && t.punct('>') && !arrow)
        {
            depth -= 1;
        } else if depth == 0 && t.punct(',') {
            parts.push(&tokens[start..i]);
            start = i + 1;
        }
    }
    if start < tokens.len() {
        parts.push(&tokens[start..]);
    }
    parts
}

#[cfg(test)]
#[path = "tokens_tests.rs"]
mod tests;
