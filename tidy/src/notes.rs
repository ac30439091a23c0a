//! The rule `notes-names`: the notes files (`*NOTES*.md` anywhere, and the root's
//! `ARCHITECTURE.md`) cite paths and types that exist.
//!
//! What is checked is the inline code spans of a notes file (backtick runs, as Markdown pairs
//! them within a paragraph); fenced code blocks (```` ``` ```` or `~~~`) are not. A span is
//! read as one of two kinds of name, or not at all:
//!
//! - **A repository path**: no whitespace, none of `* < > { } $ |`, no `://`, not absolute
//!   (`/…`, `~…`), not under `target/`; it holds a `/`; and it ends with `/` (a directory) or
//!   with one of [`PATH_EXTENSIONS`]. It is checked only when its first component names an
//!   entry of one of its bases — the repository root, the notes file's directory, the
//!   directory of the crate holding the notes file (so `src/lib.rs` in a crate's notes) — and
//!   then it must exist under that base (a directory, for a trailing `/`). A first component
//!   no base has (`step_000003/…`, `torch/…`: run outputs, other projects' files) is not a
//!   path of this tree. A span starting with `.` or `..` is relative to the notes file's
//!   directory alone, as a Markdown link is, and not checked when it climbs out of the tree
//!   (`../shared/…` from the root).
//! - **A Rust type name**: identifiers joined by `::` (a trailing `()` allowed) of which at
//!   least one is CamelCase — an ASCII capital first, at least two capitals and a lower-case
//!   letter (`HostError`, `GPTModel`; not `RSS`, not `Registry`). Every segment that starts
//!   with a capital and has a lower-case letter (`RuntimeError::Plugin`: both) must be a name
//!   the tree's code uses: an identifier in the code of a `.rs` file (comments do not count),
//!   a word of one of its string literals (`"LlamaForCausalLM"`, `"VmHWM"`: names the code
//!   reads), or an identifier of a `.py` file outside its `#` comments (the Python workers).
//!
//! A line holding [`NOT_A_NAME_MARKER`] is not checked (for a span that only looks like a name
//! of this tree).

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::lexer::scan;
use crate::walk::Tree;
use crate::{Rule, TidyError, Violation};

/// The extensions that make a span with a `/` a path to check.
pub const PATH_EXTENSIONS: [&str; 11] = [
    "rs", "py", "toml", "sh", "md", "json", "lock", "yml", "yaml", "jinja", "txt",
];

/// The marker comment that exempts its line from `notes-names`.
pub const NOT_A_NAME_MARKER: &str = "<!-- tidy: not-a-name -->";

/// Characters that make a span something other than a path.
const NOT_IN_PATHS: [char; 8] = ['*', '<', '>', '{', '}', '$', '|', '`'];

/// Checks every notes file of the tree at `root`.
pub fn check_notes(root: &Path, tree: &Tree) -> Result<Vec<Violation>, TidyError> {
    let mut out = Vec::new();
    if tree.notes.is_empty() {
        return Ok(out);
    }
    let idents = identifiers(root, tree)?;
    for notes in &tree.notes {
        let full = root.join(notes);
        let text =
            fs::read_to_string(&full).map_err(|source| TidyError::Io { path: full, source })?;
        let bases = bases(notes, &tree.manifest_dirs);
        let lines: Vec<&str> = text.lines().collect();
        for span in code_spans(&text) {
            let marked = lines
                .get(span.line - 1)
                .is_some_and(|l| l.contains(NOT_A_NAME_MARKER));
            if marked {
                continue;
            }
            let problem = match kind(&span.text) {
                Some(Kind::Path) => missing_path(root, &bases, &span.text),
                Some(Kind::Type) => unknown_type(&idents, &span.text),
                None => None,
            };
            if let Some(message) = problem {
                out.push(Violation {
                    rule: Rule::NotesNames,
                    path: notes.clone(),
                    line: Some(span.line),
                    message,
                });
            }
        }
    }
    Ok(out)
}

/// An inline code span: its text (between the backtick runs, trimmed) and its first line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The 1-based line of its opening backticks.
    pub line: usize,
    /// Its text.
    pub text: String,
}

/// The inline code spans of a Markdown text, outside fenced code blocks. A span closes at the
/// next run of as many backticks in the same paragraph; a run without one is literal text.
pub fn code_spans(text: &str) -> Vec<Span> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    // The current paragraph: (line, text) pairs.
    let mut para: Vec<(usize, &str)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let opener = fence_opener(trimmed);
        if let Some(open) = &fence {
            if opener.is_some_and(|o| o.starts_with(open.as_str())) {
                fence = None;
            }
            continue;
        }
        if let Some(o) = opener {
            spans_of(&para, &mut out);
            para.clear();
            fence = Some(o.to_string());
        } else if trimmed.is_empty() {
            spans_of(&para, &mut out);
            para.clear();
        } else {
            para.push((i + 1, line));
        }
    }
    spans_of(&para, &mut out);
    out
}

/// The fence a line opens or closes (its run of three or more backticks or tildes).
fn fence_opener(trimmed: &str) -> Option<&str> {
    let first = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let run = trimmed.len() - trimmed.trim_start_matches(first).len();
    (run >= 3).then(|| &trimmed[..run])
}

/// The spans of one paragraph.
fn spans_of(para: &[(usize, &str)], out: &mut Vec<Span>) {
    // The paragraph as one text, with the line of each byte offset.
    let mut text = String::new();
    let mut starts = Vec::new();
    for (line, l) in para {
        starts.push((text.len(), *line));
        text.push_str(l);
        text.push('\n');
    }
    let line_at = |pos: usize| {
        starts
            .iter()
            .take_while(|(start, _)| *start <= pos)
            .last()
            .map_or(0, |(_, line)| *line)
    };
    let runs: Vec<(usize, usize)> = backtick_runs(&text);
    let mut i = 0;
    while i < runs.len() {
        let (pos, len) = runs[i];
        let close = (i + 1..runs.len()).find(|&j| runs[j].1 == len);
        let Some(j) = close else {
            i += 1;
            continue;
        };
        let inner = &text[pos + len..runs[j].0];
        out.push(Span {
            line: line_at(pos),
            text: inner.trim().to_string(),
        });
        i = j + 1;
    }
}

/// The backtick runs of `text`: (byte offset, length).
fn backtick_runs(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let start = i;
            while i < bytes.len() && bytes[i] == b'`' {
                i += 1;
            }
            runs.push((start, i - start));
        } else {
            i += 1;
        }
    }
    runs
}

/// What a span names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A repository path.
    Path,
    /// A Rust type name (maybe with a path).
    Type,
}

/// What `span` names, if it is a name this rule checks (see the module doc).
pub fn kind(span: &str) -> Option<Kind> {
    if is_path_like(span) {
        Some(Kind::Path)
    } else if is_type_like(span) {
        Some(Kind::Type)
    } else {
        None
    }
}

fn is_path_like(span: &str) -> bool {
    if span.is_empty()
        || span.chars().any(char::is_whitespace)
        || span.contains(NOT_IN_PATHS)
        || span.contains("://")
        || span.starts_with('/')
        || span.starts_with('~')
        || span.starts_with("target/")
        || !span.contains('/')
    {
        return false;
    }
    if span.ends_with('/') {
        return true;
    }
    let last = span.rsplit('/').next().unwrap_or_default();
    last.rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && PATH_EXTENSIONS.contains(&ext))
}

/// The `::` segments of a type-like span (a trailing `()` dropped), if it is one.
fn type_segments(span: &str) -> Option<Vec<&str>> {
    let span = span.strip_suffix("()").unwrap_or(span);
    let segments: Vec<&str> = span.split("::").collect();
    let ident = |s: &str| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let all_idents = segments.iter().all(|s| ident(s));
    (all_idents && segments.iter().any(|s| is_camel_case(s))).then_some(segments)
}

fn is_type_like(span: &str) -> bool {
    type_segments(span).is_some()
}

/// An ASCII capital first, at least two capitals, and a lower-case letter.
fn is_camel_case(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_uppercase())
        && word.chars().filter(char::is_ascii_uppercase).count() >= 2
        && word.chars().any(|c| c.is_ascii_lowercase())
}

/// A segment checked against the identifiers: a capital first and a lower-case letter.
fn is_checked_segment(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_uppercase())
        && word.chars().any(|c| c.is_ascii_lowercase())
}

/// Every name the tree's code uses (see the module doc).
fn identifiers(root: &Path, tree: &Tree) -> Result<HashSet<String>, TidyError> {
    let mut out = HashSet::new();
    for file in &tree.files {
        let scanned = scan(&file.text);
        words(&scanned.code, &mut out);
        for lit in &scanned.strings {
            words(&lit.text, &mut out);
        }
    }
    for path in &tree.py_files {
        let full = root.join(path);
        let text =
            fs::read_to_string(&full).map_err(|source| TidyError::Io { path: full, source })?;
        for line in text.lines() {
            words(line.split('#').next().unwrap_or_default(), &mut out);
        }
    }
    Ok(out)
}

/// Adds the identifier-shaped words of `text` to `out`.
fn words(text: &str, out: &mut HashSet<String>) {
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        if !word.is_empty() && !word.starts_with(|c: char| c.is_ascii_digit()) {
            out.insert(word.to_string());
        }
    }
}

/// Why a type-like span names nothing of the tree, if it does not.
fn unknown_type(idents: &HashSet<String>, span: &str) -> Option<String> {
    let segments = type_segments(span)?;
    let unknown: Vec<&str> = segments
        .into_iter()
        .filter(|s| is_checked_segment(s) && !idents.contains(*s))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    Some(format!(
        "`{span}`: the tree's code has no `{}`: name what the code has now (or, for a name \
         of another project, mark the line `{NOT_A_NAME_MARKER}`)",
        unknown.join("`, `")
    ))
}

/// The directories a path in the notes file `notes` may be relative to: the root, its
/// directory, and its crate's directory (when another).
fn bases(notes: &Path, manifest_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let dir = notes.parent().unwrap_or(Path::new("")).to_path_buf();
    let krate = manifest_dirs
        .iter()
        .filter(|d| dir.starts_with(d))
        .max_by_key(|d| d.components().count())
        .cloned();
    // The notes file's directory is always second (even when it is the root).
    let mut out = vec![PathBuf::new(), dir];
    if let Some(krate) = krate
        && !out.contains(&krate)
    {
        out.push(krate);
    }
    out
}

/// Why a path-like span names nothing of the tree, if it does not.
fn missing_path(root: &Path, bases: &[PathBuf], span: &str) -> Option<String> {
    let dir = span.ends_with('/');
    let first = Path::new(span).components().next();
    // `./…` and `../…`: relative to the notes file's directory alone (the second base).
    let relative = matches!(first, Some(Component::CurDir | Component::ParentDir));
    let bases = if relative { &bases[1..2] } else { bases };
    let mut checked = false;
    for base in bases {
        let Some(rel) = normalize(&base.join(span)) else {
            continue;
        };
        if let Some(Component::Normal(first)) = first
            && !root.join(base).join(first).exists()
        {
            continue;
        }
        checked = true;
        let full = root.join(&rel);
        if (dir && full.is_dir()) || (!dir && full.is_file()) {
            return None;
        }
    }
    if !checked {
        return None;
    }
    let mut bases: Vec<String> = bases
        .iter()
        .map(|b| {
            if b.as_os_str().is_empty() {
                "the repository root".to_string()
            } else {
                format!("`{}/`", b.display())
            }
        })
        .collect();
    bases.dedup();
    Some(format!(
        "`{span}` is no {} under {}: cite the path as it is now",
        if dir { "directory" } else { "file" },
        bases.join(", ")
    ))
}

/// `path` with `.` and `..` resolved lexically; `None` when it climbs out of the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
#[path = "notes_tests.rs"]
mod tests;
