//! The rule `host-names-no-plugin`: no host crate names a plugin's component or option key in
//! a string literal, except where [`ALLOWLIST`] says why.
//!
//! The names are read from the plugin-layer crates each run (`plugin_names`); the layers come
//! from the `crate-edges` block of `ARCHITECTURE.md`, the crates' names from their
//! `Cargo.toml`. Only checked crates count (not those under `tests/`, `examples/`, `benches/`).
//! A host literal breaks the rule when its whole value equals a name and it is in non-test code:
//! not in a `tests.rs` / `*_tests.rs` file or a `tests/` directory, not in an item under
//! `#[cfg(test)]`.
//!
//! The allowlist has one line per file and literal: `PATH "LITERAL"  # why` (`PATH` relative
//! to the root; the line allows every occurrence of the literal in that file). Blank lines and
//! lines starting with `#` are comments. A line without a reason, naming a literal that is no
//! plugin name, or one the file no longer holds, is a violation too.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::block::parse_block;
use crate::lexer::scan;
use crate::plugin_names::{Kind, Names, PluginFile, crate_names};
use crate::tokens::{Tok, is_test_file, tokenize, without_tests};
use crate::walk::Tree;
use crate::{Rule, TidyError, Violation};

/// The allowlist, relative to the root.
pub const ALLOWLIST: &str = "tidy/host-plugin-names.allow";

/// What the rule found: its violations and how many names of each kind the plugins declare.
#[derive(Debug, Default)]
pub struct Found {
    /// The violations.
    pub violations: Vec<Violation>,
    /// Distinct component (and plugin) names.
    pub components: usize,
    /// Distinct option keys.
    pub option_keys: usize,
}

/// Checks the host crates of the tree at `root` against the names of its plugin crates.
pub fn check_host_names(root: &Path, tree: &Tree) -> Result<Found, TidyError> {
    let mut found = Found::default();
    let markdown = match fs::read_to_string(root.join("ARCHITECTURE.md")) {
        Ok(text) => text,
        // No document: the rule `crate-edges` says so; no layers, nothing to check here.
        Err(_) => return Ok(found),
    };
    let Some(block) = parse_block(&markdown).0 else {
        return Ok(found);
    };
    let mut layers: Vec<Option<&str>> = Vec::new();
    for krate in &tree.crates {
        let manifest = root.join(&krate.dir).join("Cargo.toml");
        let text = fs::read_to_string(&manifest).map_err(|source| TidyError::Io {
            path: manifest,
            source,
        })?;
        layers.push(package_name(&text).and_then(|name| block.layer_of(&name)));
    }
    let layer_of = |index: Option<usize>| index.and_then(|i| layers[i]);

    let scanned: Vec<_> = tree.files.iter().map(|f| scan(&f.text)).collect();
    let tokens: Vec<_> = scanned
        .iter()
        .zip(&tree.files)
        .map(|(s, f)| {
            let test = is_test_file(&f.path);
            if test {
                Vec::new()
            } else {
                without_tests(tokenize(s))
            }
        })
        .collect();

    let mut names = Names::new();
    for (index, layer) in layers.iter().enumerate() {
        if *layer != Some("plugin") {
            continue;
        }
        let files: Vec<PluginFile<'_>> = (0..tree.files.len())
            .filter(|&f| tree.files[f].crate_index == Some(index))
            .map(|f| PluginFile {
                path: &tree.files[f].path,
                scanned: &scanned[f],
                tokens: &tokens[f],
            })
            .collect();
        crate_names(&files, &mut names, &mut found.violations);
    }
    let count = |kind| {
        names
            .values()
            .filter(|o| o.iter().any(|o| o.kind == kind))
            .count()
    };
    found.components = count(Kind::Component);
    found.option_keys = count(Kind::OptionKey);

    let (allowed, mut problems) = allowlist(root, &names)?;
    found.violations.append(&mut problems);
    let mut used: BTreeSet<(PathBuf, String)> = BTreeSet::new();
    for (f, file) in tree.files.iter().enumerate() {
        if layer_of(file.crate_index) != Some("host") {
            continue;
        }
        for token in &tokens[f] {
            let Tok::Str(k) = token.tok else {
                continue;
            };
            let text = &scanned[f].strings[k].text;
            let Some(origins) = names.get(text) else {
                continue;
            };
            let key = (file.path.clone(), text.clone());
            if allowed.contains_key(&key) {
                used.insert(key);
                continue;
            }
            found.violations.push(Violation {
                rule: Rule::HostNamesNoPlugin,
                path: file.path.clone(),
                line: Some(token.line),
                message: format!(
                    "the host names \"{text}\", {}: ask the plugin through its capabilities or \
                     `describe_config` instead, or add the line `{} \"{text}\"  # why` to \
                     {ALLOWLIST}",
                    what(origins),
                    file.path.display()
                ),
            });
        }
    }
    for (key, line) in allowed {
        if !used.contains(&key) {
            let message = format!(
                "stale: {} holds no literal \"{}\" outside its tests: remove this line",
                key.0.display(),
                key.1
            );
            found.violations.push(at_list(line, message));
        }
    }
    Ok(found)
}

/// What a name is, where the plugins declare it first.
fn what(origins: &[crate::plugin_names::Origin]) -> String {
    let Some(first) = origins.iter().min() else {
        return String::new();
    };
    let kind = match first.kind {
        Kind::Component => "a plugin's component name",
        Kind::OptionKey => "a plugin's option key",
    };
    format!("{kind} ({}:{})", first.path.display(), first.line)
}

fn at_list(line: usize, message: String) -> Violation {
    Violation {
        rule: Rule::HostNamesNoPlugin,
        path: PathBuf::from(ALLOWLIST),
        line: Some(line),
        message,
    }
}

/// The allowlist's lines, (path, literal) → line, and the problems of the file itself.
type Allowed = BTreeMap<(PathBuf, String), usize>;

/// Reads [`ALLOWLIST`] under `root` (absent: empty).
fn allowlist(root: &Path, names: &Names) -> Result<(Allowed, Vec<Violation>), TidyError> {
    let path = root.join(ALLOWLIST);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(TidyError::Io { path, source }),
    };
    let mut allowed = Allowed::new();
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (file, literal) = match parse_line(trimmed) {
            Ok(parsed) => parsed,
            Err(message) => {
                problems.push(at_list(line_no, message));
                continue;
            }
        };
        if !names.contains_key(&literal) {
            let message = format!(
                "stale: \"{literal}\" is no longer a plugin's component name or option key: \
                 remove this line"
            );
            problems.push(at_list(line_no, message));
            continue;
        }
        let key = (PathBuf::from(file), literal);
        if let Some(first) = allowed.get(&key) {
            let message = format!("the same file and literal as line {first}: remove one");
            problems.push(at_list(line_no, message));
            continue;
        }
        allowed.insert(key, line_no);
    }
    Ok((allowed, problems))
}

/// `PATH "LITERAL"  # why` → (PATH, LITERAL).
fn parse_line(line: &str) -> Result<(&str, String), String> {
    let shape = "a line is `PATH \"LITERAL\"  # why`";
    let (path, rest) = line
        .split_once(char::is_whitespace)
        .ok_or_else(|| format!("{shape}: add the literal and the reason"))?;
    let rest = rest.trim_start();
    let literal = rest
        .strip_prefix('"')
        .and_then(|r| r.split_once('"'))
        .ok_or_else(|| format!("{shape}: put the literal in double quotes"))?;
    let reason = literal.1.trim_start().strip_prefix('#').map(str::trim);
    match reason {
        Some(why) if !why.is_empty() => Ok((path, literal.0.to_string())),
        _ => Err(format!(
            "{shape}: say after `#` why the host may name \"{}\" here",
            literal.0
        )),
    }
}

/// The `name` of a manifest's `[package]` table.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if in_package && key.trim() == "name" {
            return Some(value.trim().trim_matches('"').to_string());
        }
    }
    None
}
