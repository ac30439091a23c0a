//! The `crate-edges` block of `ARCHITECTURE.md`: finding it and parsing it.
//!
//! The block is a fenced code block with the info string `crate-edges`:
//!
//! ```text
//! # `#` starts a comment; blank lines are ignored.
//! layer host: tandem-rl tandem-services
//! layer plugin: tandem-plugin-native
//! tandem-rl -> tandem-services tandem-plugin-api
//! tandem-plugin-native -> tandem-plugin-api
//! ```
//!
//! `layer NAME: CRATE...` puts crates in a layer (a crate is in at most one layer; crates may be
//! in none). `CRATE -> CRATE...` lists the workspace crates a crate depends on as a normal or
//! build dependency, one line per crate. Only the layers `host` and `plugin` have a rule: no
//! crate of `host` may depend on a crate of `plugin`.

use std::collections::{BTreeMap, BTreeSet};

/// The info string of the block.
pub const INFO: &str = "crate-edges";

/// One declared line: where it is and the crates it names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    /// The 1-based line in `ARCHITECTURE.md`.
    pub line: usize,
    /// The crates on its right-hand side.
    pub crates: BTreeSet<String>,
}

/// A parsed block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgesBlock {
    /// The 1-based line of the opening fence.
    pub fence_line: usize,
    /// Layer name → its line and crates.
    pub layers: BTreeMap<String, Declared>,
    /// Crate → its edge line and the crates it depends on.
    pub edges: BTreeMap<String, Declared>,
}

impl EdgesBlock {
    /// The layer `krate` is in, if any.
    pub fn layer_of(&self, krate: &str) -> Option<&str> {
        self.layers
            .iter()
            .find(|(_, d)| d.crates.contains(krate))
            .map(|(name, _)| name.as_str())
    }
}

/// A problem with the block itself: its 1-based line (`None`: the file as a whole) and a
/// one-line message.
pub type Problem = (Option<usize>, String);

/// Finds and parses the one `crate-edges` block of `markdown`. Returns the block (`None` when
/// there is none) and the problems found; a block with problems still holds the lines that
/// parsed.
pub fn parse_block(markdown: &str) -> (Option<EdgesBlock>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut blocks: Vec<(usize, Vec<(usize, &str)>)> = Vec::new();
    let mut fence: Option<(usize, bool)> = None; // (backticks, is a crate-edges block)
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|&c| c == '`').count();
        match fence {
            None if ticks >= 3 => {
                let ours = trimmed[ticks..].trim() == INFO;
                if ours {
                    blocks.push((i + 1, Vec::new()));
                }
                fence = Some((ticks, ours));
            }
            Some((open, _)) if ticks >= open && trimmed[ticks..].trim().is_empty() => fence = None,
            Some((_, true)) => {
                if let Some((_, lines)) = blocks.last_mut() {
                    lines.push((i + 1, line));
                }
            }
            _ => {}
        }
    }
    let mut blocks = blocks.into_iter();
    let Some((fence_line, lines)) = blocks.next() else {
        problems.push((
            None,
            format!(
                "no ```{INFO} block: add one with `layer host: CRATE...`, `layer plugin: \
                 CRATE...` and one `CRATE -> DEPENDENCY...` line per crate"
            ),
        ));
        return (None, problems);
    };
    for (line, _) in blocks {
        problems.push((
            Some(line),
            format!("a second ```{INFO} block (the first is at line {fence_line}): merge them"),
        ));
    }
    let mut block = EdgesBlock {
        fence_line,
        ..EdgesBlock::default()
    };
    for (line, text) in lines {
        if let Err(message) = parse_line(&mut block, line, text) {
            problems.push((Some(line), message));
        }
    }
    (Some(block), problems)
}

/// Parses one line of the block into `block`.
fn parse_line(block: &mut EdgesBlock, line: usize, text: &str) -> Result<(), String> {
    let text = text.split('#').next().unwrap_or_default().trim();
    if text.is_empty() {
        return Ok(());
    }
    if let Some(rest) = text.strip_prefix("layer ") {
        let (name, crates) = rest
            .split_once(':')
            .ok_or("a layer line is `layer NAME: CRATE...`: add the `:`")?;
        let name = single_word(name).ok_or("a layer name is one word: `layer NAME: CRATE...`")?;
        if let Some(other) = block.layers.get(name) {
            return Err(format!(
                "layer `{name}` is already declared at line {}: put its crates on one line",
                other.line
            ));
        }
        let crates = names(crates)?;
        for krate in &crates {
            if let Some((other, d)) = block.layers.iter().find(|(_, d)| d.crates.contains(krate)) {
                return Err(format!(
                    "`{krate}` is already in layer `{other}` (line {}): a crate is in at most \
                     one layer",
                    d.line
                ));
            }
        }
        block
            .layers
            .insert(name.to_string(), Declared { line, crates });
        return Ok(());
    }
    let (from, to) = text.split_once("->").ok_or(
        "expected `layer NAME: CRATE...` or `CRATE -> DEPENDENCY...` (`#` starts a comment)",
    )?;
    let from = single_word(from).ok_or("an edge line is `CRATE -> DEPENDENCY...`: one crate")?;
    if let Some(other) = block.edges.get(from) {
        return Err(format!(
            "`{from}` already has an edge line (line {}): one line per crate",
            other.line
        ));
    }
    let crates = names(to)?;
    if crates.contains(from) {
        return Err(format!(
            "`{from}` cannot depend on itself: remove it from its line"
        ));
    }
    block
        .edges
        .insert(from.to_string(), Declared { line, crates });
    Ok(())
}

fn single_word(text: &str) -> Option<&str> {
    let mut words = text.split_whitespace();
    let word = words.next()?;
    words.next().is_none().then_some(word)
}

/// The crate names of a right-hand side, each named once.
fn names(text: &str) -> Result<BTreeSet<String>, String> {
    let mut set = BTreeSet::new();
    for name in text.split_whitespace() {
        if !set.insert(name.to_string()) {
            return Err(format!("`{name}` is listed twice: name it once"));
        }
    }
    Ok(set)
}

#[cfg(test)]
#[path = "block_tests.rs"]
mod tests;
