//! The rules on source files: `module-docs`, `forbid-unsafe`, `no-pasted-help` (the files under
//! a checked crate's `src/`) and `file-length` (every `.rs` file of the tree).

use std::path::Path;

use crate::lexer::{Scanned, scan};
use crate::walk::{SourceFile, Tree};
use crate::{HELP_FORMAT_MARKER, MAX_FILE_LINES, Rule, Violation};

/// What a pasted help suffix starts with, before its `:` (kept apart here, so that this file's
/// own literals do not break the rule).
const HELP_OPENING: &str = "(help";

/// What `unsafe` may be followed by for it to be unsafe code (an attribute `unsafe(..)`, a
/// block, or an item).
const UNSAFE_ITEMS: [&str; 4] = ["fn", "impl", "extern", "trait"];

/// Checks every file of the tree.
pub fn check_sources(tree: &Tree) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut has_unsafe = vec![false; tree.crates.len()];
    // (crate, crate root file, whether it forbids unsafe code)
    let mut roots = Vec::new();
    for file in &tree.files {
        if file.lines > MAX_FILE_LINES {
            out.push(violation(
                Rule::FileLength,
                &file.path,
                None,
                format!(
                    "{} lines (limit {MAX_FILE_LINES}): split it into smaller modules",
                    file.lines
                ),
            ));
        }
        let Some(index) = file.crate_index else {
            continue;
        };
        module_docs(file, &mut out);
        let scanned = scan(&file.text);
        has_unsafe[index] |= uses_unsafe(&scanned.code);
        pasted_help(file, &scanned, &mut out);
        let dir = &tree.crates[index].dir;
        if file.path == dir.join("src/lib.rs") || file.path == dir.join("src/main.rs") {
            roots.push((index, file, forbids_unsafe(&scanned.code)));
        }
    }
    for (index, file, forbids) in roots {
        if !has_unsafe[index] && !forbids {
            let dir = &tree.crates[index].dir;
            let name = if dir.as_os_str().is_empty() {
                ".".into()
            } else {
                dir.display().to_string()
            };
            out.push(violation(
                Rule::ForbidUnsafe,
                &file.path,
                None,
                format!(
                    "crate `{name}` has no unsafe code but this crate root lacks \
                     `#![forbid(unsafe_code)]`: add it below the module docs"
                ),
            ));
        }
    }
    out
}

fn violation(rule: Rule, path: &Path, line: Option<usize>, message: String) -> Violation {
    Violation {
        rule,
        path: path.to_path_buf(),
        line,
        message,
    }
}

/// `module-docs`: the first non-blank line is a `//!` comment.
fn module_docs(file: &SourceFile, out: &mut Vec<Violation>) {
    let first = file
        .text
        .lines()
        .enumerate()
        .find(|(_, l)| !l.trim().is_empty());
    let message = match first {
        Some((_, l)) if l.trim_start().starts_with("//!") => return,
        Some(_) => {
            "the first line is not a `//!` module doc: start the file with `//!` lines \
                    saying what the module is for"
        }
        None => "empty file without a `//!` module doc: add one, or remove the file",
    };
    let line = first.map_or(1, |(i, _)| i + 1);
    out.push(violation(
        Rule::ModuleDocs,
        &file.path,
        Some(line),
        message.to_string(),
    ));
}

/// `no-pasted-help`: no string literal holds `(help:`, except on a marked line.
fn pasted_help(file: &SourceFile, scanned: &Scanned, out: &mut Vec<Violation>) {
    let lines: Vec<&str> = file.text.lines().collect();
    let mut last = 0;
    for lit in &scanned.strings {
        let pasted = lit
            .text
            .match_indices(HELP_OPENING)
            .filter(|(pos, open)| lit.text[pos + open.len()..].starts_with(':'));
        for (pos, _) in pasted {
            let line = lit.line + lit.text[..pos].matches('\n').count();
            let marked = lines
                .get(line - 1)
                .is_some_and(|l| l.contains(HELP_FORMAT_MARKER));
            if marked || line == last {
                continue;
            }
            last = line;
            out.push(violation(
                Rule::NoPastedHelp,
                &file.path,
                Some(line),
                format!(
                    "a string literal pastes a `help:` suffix into a message: carry the help \
                     as a structured field and render it once at the binary edge (that line \
                     marked `{HELP_FORMAT_MARKER}`)"
                ),
            ));
        }
    }
}

/// Whether `code` (comments and literals removed) uses `unsafe`: `unsafe {`, `unsafe fn`,
/// `unsafe impl`, `unsafe extern`, `unsafe trait` or an unsafe attribute `#[unsafe(..)]`.
fn uses_unsafe(code: &str) -> bool {
    code.match_indices("unsafe").any(|(pos, word)| {
        let before = code[..pos].chars().next_back();
        let after = &code[pos + word.len()..];
        if before.is_some_and(is_ident) || after.chars().next().is_some_and(is_ident) {
            return false;
        }
        let rest = after.trim_start();
        if rest.starts_with('{') || rest.starts_with('(') {
            return true;
        }
        let next: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        UNSAFE_ITEMS.contains(&next.as_str())
    })
}

/// Whether `code` holds `#![forbid(..., unsafe_code, ...)]`.
fn forbids_unsafe(code: &str) -> bool {
    let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    compact.match_indices("#![forbid(").any(|(pos, open)| {
        let args = &compact[pos + open.len()..];
        let args = args.split(')').next().unwrap_or_default();
        args.split(',').any(|lint| lint == "unsafe_code")
    })
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::{forbids_unsafe, uses_unsafe};

    #[test]
    fn unsafe_code_is_found() {
        for code in [
            "unsafe { x() }",
            "pub unsafe fn f() {}",
            "unsafe impl Send for X {}",
            "unsafe extern \"C\" {}",
            "pub unsafe trait T {}",
            "#[unsafe(no_mangle)]",
            "let a = 1;\nunsafe\n{ }",
        ] {
            assert!(uses_unsafe(code), "{code}");
        }
    }

    #[test]
    fn other_words_are_not_unsafe_code() {
        for code in [
            "#![forbid(unsafe_code)]",
            "fn not_unsafe() {}",
            "let unsafe_ptr = 1;",
            "$(unsafe)?",
        ] {
            assert!(!uses_unsafe(code), "{code}");
        }
    }

    #[test]
    fn forbid_is_found_in_any_lint_list() {
        assert!(forbids_unsafe("//! x\n#![forbid(unsafe_code)]\n"));
        assert!(forbids_unsafe(
            "#![ forbid( missing_docs,\n unsafe_code ) ]"
        ));
        assert!(!forbids_unsafe("#![deny(unsafe_code)]"));
        assert!(!forbids_unsafe("#![forbid(missing_docs)]"));
    }
}
