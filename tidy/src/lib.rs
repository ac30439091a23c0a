//! `tandem-tidy`: the architecture invariants of the Tandem tree, checked as a test.
//!
//! [`check`] walks a source tree (the repository root, or a small tree a test builds) and
//! returns a [`Report`]: every [`Violation`] of the rules below, each with the file (and line
//! where one applies) and a one-line message that says how to fix it, plus a few [`Figures`].
//!
//! The rules ([`Rule`]):
//! - `module-docs`: every `.rs` file under a crate's `src/` starts with a `//!` comment.
//! - `crate-edges`: the `crate-edges` block of `ARCHITECTURE.md` declares exactly the
//!   dependency edges between workspace crates (from `cargo metadata`), and no crate of layer
//!   `host` depends on a crate of layer `plugin`.
//! - `forbid-unsafe`: a crate without `unsafe` code says so with `#![forbid(unsafe_code)]`.
//! - `no-pasted-help`: no string literal holds `(help:` (help travels as structured data),
//!   except on a line marked `// tidy: help-format`.
//! - `file-length`: no `.rs` file is longer than [`MAX_FILE_LINES`] lines.
//! - `notes-names`: the notes files (`*NOTES*.md` anywhere, the root's `ARCHITECTURE.md`)
//!   cite repository paths that exist and Rust type names that are identifiers of the tree's
//!   `.rs` code (inline code spans; which spans are names: the `notes` module's doc).
//! - `host-names-no-plugin`: no string literal in the non-test code of a `host` crate is, as a
//!   whole, a component name or option key a `plugin` crate declares (read from the plugins'
//!   source each run: `ComponentDecl` names, `sdk::manifest` names, the fields of their
//!   `deny_unknown_fields` options structs), except the file and literal pairs
//!   [`HOST_NAMES_ALLOWLIST`] lists, each with its reason; a line of it that no longer matches
//!   is stale. The host learns what a plugin offers through the ABI (capabilities,
//!   `describe_config`), not by knowing its names.
//!
//! Crates are the directories holding a `Cargo.toml`, found by walking the tree; the walk
//! skips `target/` and hidden directories, and crates inside `tests/`, `examples/` or
//! `benches/` directories are test or example code, not checked by the source rules.

#![forbid(unsafe_code)]

mod block;
mod edges;
mod host_names;
mod lexer;
mod notes;
mod plugin_names;
mod sources;
mod tokens;
mod walk;

use std::fmt;
use std::path::{Path, PathBuf};

pub use edges::edges_block;
pub use host_names::ALLOWLIST as HOST_NAMES_ALLOWLIST;
pub use notes::{NOT_A_NAME_MARKER, PATH_EXTENSIONS};

/// The longest a `.rs` file may be, in lines (rule `file-length`).
pub const MAX_FILE_LINES: usize = 500;

/// The marker comment that allows `(help:` in a string literal on its line (rule
/// `no-pasted-help`): the one place that renders help at the binary edge.
pub const HELP_FORMAT_MARKER: &str = "// tidy: help-format";

/// One rule of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// Every source file starts with a `//!` module doc comment.
    ModuleDocs,
    /// `ARCHITECTURE.md` declares the crate edges and layers, and the tree keeps to them.
    CrateEdges,
    /// A crate without `unsafe` code forbids it in its crate roots.
    ForbidUnsafe,
    /// No string literal pastes `(help: ...)` into a message.
    NoPastedHelp,
    /// No `.rs` file is longer than [`MAX_FILE_LINES`].
    FileLength,
    /// The paths and type names the notes files cite exist.
    NotesNames,
    /// No host crate names a plugin's component or option key, except where allowed.
    HostNamesNoPlugin,
}

impl Rule {
    /// The rule's name as reports print it (`module-docs`, `crate-edges`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Rule::ModuleDocs => "module-docs",
            Rule::CrateEdges => "crate-edges",
            Rule::ForbidUnsafe => "forbid-unsafe",
            Rule::NoPastedHelp => "no-pasted-help",
            Rule::FileLength => "file-length",
            Rule::NotesNames => "notes-names",
            Rule::HostNamesNoPlugin => "host-names-no-plugin",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken rule at one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The file, relative to the checked root (`/`-separated on Unix).
    pub path: PathBuf,
    /// The 1-based line, where the violation has one.
    pub line: Option<usize>,
    /// One line: what is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Violation {
    /// `path:line: rule: message` (or `path: rule: message` without a line).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {}: {}", self.rule, self.message)
    }
}

/// Sizes of the tree, over every `.rs` file the walk found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    /// How many `.rs` files the tree holds.
    pub rs_files: usize,
    /// The longest `.rs` file and its line count (`None` in a tree without Rust files).
    pub longest: Option<(PathBuf, usize)>,
    /// The median line count of a `.rs` file (the upper middle for an even count; 0 without
    /// files).
    pub median_lines: usize,
    /// The distinct component and plugin names the plugin crates declare.
    pub plugin_components: usize,
    /// The distinct option keys of the plugin crates' options structs.
    pub plugin_option_keys: usize,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} .rs files", self.rs_files)?;
        if let Some((path, lines)) = &self.longest {
            write!(f, "; longest {} ({lines} lines)", path.display())?;
        }
        write!(f, "; median {} lines per module", self.median_lines)?;
        write!(
            f,
            "; plugin names: {} components, {} option keys",
            self.plugin_components, self.plugin_option_keys
        )
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Every violation, sorted by file, line and rule.
    pub violations: Vec<Violation>,
    /// Sizes of the tree.
    pub figures: Figures,
}

impl Report {
    /// The violations of one rule.
    pub fn of(&self, rule: Rule) -> Vec<&Violation> {
        self.violations.iter().filter(|v| v.rule == rule).collect()
    }
}

/// Why [`check`] could not check the tree (a broken tree is a [`Report`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum TidyError {
    /// A file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `cargo metadata` failed on the root's `Cargo.toml`.
    #[error("cargo metadata on {}: {source}", manifest.display())]
    Metadata {
        /// The manifest given to `cargo metadata`.
        manifest: PathBuf,
        /// The underlying error (its text holds cargo's stderr).
        source: cargo_metadata::Error,
    },
}

/// Checks every rule on the tree at `root` (a directory with a workspace `Cargo.toml`).
///
/// Runs `cargo metadata --no-deps --offline` on `root/Cargo.toml` for the crate edges.
pub fn check(root: &Path) -> Result<Report, TidyError> {
    let root = root.canonicalize().map_err(|source| TidyError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    let tree = walk::walk(&root)?;
    let mut violations = sources::check_sources(&tree);
    violations.extend(edges::check_edges(&root)?);
    violations.extend(notes::check_notes(&root, &tree)?);
    let names = host_names::check_host_names(&root, &tree)?;
    violations.extend(names.violations);
    violations.sort_by(|a, b| {
        (&a.path, a.line, a.rule, &a.message).cmp(&(&b.path, b.line, b.rule, &b.message))
    });
    let figures = Figures {
        plugin_components: names.components,
        plugin_option_keys: names.option_keys,
        ..figures(&tree)
    };
    Ok(Report {
        violations,
        figures,
    })
}

fn figures(tree: &walk::Tree) -> Figures {
    let mut lines: Vec<usize> = tree.files.iter().map(|f| f.lines).collect();
    lines.sort_unstable();
    let longest = tree
        .files
        .iter()
        .max_by(|a, b| a.lines.cmp(&b.lines).then_with(|| b.path.cmp(&a.path)))
        .map(|f| (f.path.clone(), f.lines));
    Figures {
        rs_files: tree.files.len(),
        longest,
        median_lines: lines.get(lines.len() / 2).copied().unwrap_or(0),
        ..Figures::default()
    }
}
