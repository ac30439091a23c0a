//! Walking the tree: every `.rs` file, the crates (directories with a `Cargo.toml`) whose
//! `src/` the source rules check, the notes files (`*NOTES*.md` anywhere, and the root's
//! `ARCHITECTURE.md`) and the `.py` files (whose names the notes may cite).
//!
//! The walk skips `target/` and hidden directories and follows no symbolic links. Crates
//! inside a `tests/`, `examples/` or `benches/` directory are test or example code: their files
//! count for `file-length` and the figures, but they are not checked crates.

use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::TidyError;

/// Directory names whose crates are not checked by the source rules.
const NOT_CRATE_SOURCES: [&str; 3] = ["tests", "examples", "benches"];

/// One `.rs` file of the tree.
#[derive(Debug)]
pub struct SourceFile {
    /// Relative to the root.
    pub path: PathBuf,
    /// The whole text.
    pub text: String,
    /// Its line count.
    pub lines: usize,
    /// The checked crate (index into [`Tree::crates`]) when the file is under its `src/`.
    pub crate_index: Option<usize>,
}

/// One checked crate: a directory with a `Cargo.toml` and a `src/`.
#[derive(Debug)]
pub struct Crate {
    /// Relative to the root (empty for a crate at the root).
    pub dir: PathBuf,
}

/// What the walk found.
#[derive(Debug, Default)]
pub struct Tree {
    /// Every `.rs` file, sorted by path.
    pub files: Vec<SourceFile>,
    /// The checked crates, sorted by directory.
    pub crates: Vec<Crate>,
    /// Every directory holding a `Cargo.toml` (checked crates or not), relative to the root,
    /// sorted.
    pub manifest_dirs: Vec<PathBuf>,
    /// The notes files, relative to the root, sorted.
    pub notes: Vec<PathBuf>,
    /// Every `.py` file, relative to the root, sorted.
    pub py_files: Vec<PathBuf>,
}

/// Whether the file `name` in the directory `rel` (relative to the root) is a notes file.
fn is_notes(rel: &Path, name: &str) -> bool {
    (name.contains("NOTES") && name.ends_with(".md"))
        || (rel.as_os_str().is_empty() && name == "ARCHITECTURE.md")
}

/// Walks the tree at `root` (an absolute, canonical path).
pub fn walk(root: &Path) -> Result<Tree, TidyError> {
    let mut rs_files = Vec::new();
    let mut crate_dirs = Vec::new();
    let mut notes = Vec::new();
    let mut py_files = Vec::new();
    let mut found = Found {
        rs_files: &mut rs_files,
        crate_dirs: &mut crate_dirs,
        notes: &mut notes,
        py_files: &mut py_files,
    };
    visit(root, Path::new(""), &mut found)?;
    rs_files.sort();
    crate_dirs.sort();
    notes.sort();
    py_files.sort();

    let mut tree = Tree {
        notes,
        py_files,
        ..Tree::default()
    };
    let mut checked: Vec<Option<usize>> = Vec::with_capacity(crate_dirs.len());
    for dir in &crate_dirs {
        if is_checked_crate(dir) {
            checked.push(Some(tree.crates.len()));
            tree.crates.push(Crate { dir: dir.clone() });
        } else {
            checked.push(None);
        }
    }
    for path in rs_files {
        let full = root.join(&path);
        let text =
            fs::read_to_string(&full).map_err(|source| TidyError::Io { path: full, source })?;
        let crate_index = owner(&crate_dirs, &path).and_then(|i| {
            let under_src = path
                .strip_prefix(&crate_dirs[i])
                .is_ok_and(|p| p.starts_with("src"));
            if under_src { checked[i] } else { None }
        });
        tree.files.push(SourceFile {
            lines: text.lines().count(),
            path,
            text,
            crate_index,
        });
    }
    tree.manifest_dirs = crate_dirs;
    Ok(tree)
}

/// What [`visit`] collects.
struct Found<'a> {
    rs_files: &'a mut Vec<PathBuf>,
    crate_dirs: &'a mut Vec<PathBuf>,
    notes: &'a mut Vec<PathBuf>,
    py_files: &'a mut Vec<PathBuf>,
}

fn visit(root: &Path, rel: &Path, found: &mut Found<'_>) -> Result<(), TidyError> {
    let dir = root.join(rel);
    let io = |source| TidyError::Io {
        path: dir.clone(),
        source,
    };
    let mut entries = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let kind = entry.file_type().map_err(io)?;
        entries.push((entry.file_name(), kind));
    }
    for (name, kind) in entries {
        let Some(name_str) = name.to_str() else {
            continue;
        };
        let child = rel.join(&name);
        if kind.is_dir() {
            if name_str.starts_with('.') || name_str == "target" {
                continue;
            }
            visit(root, &child, found)?;
        } else if kind.is_file() {
            if name_str == "Cargo.toml" {
                found.crate_dirs.push(rel.to_path_buf());
            } else if name_str.ends_with(".rs") {
                found.rs_files.push(child);
            } else if name_str.ends_with(".py") {
                found.py_files.push(child);
            } else if is_notes(rel, name_str) {
                found.notes.push(child);
            }
        }
    }
    Ok(())
}

/// Whether the crate at `dir` is one the source rules check: it has no `tests`, `examples` or
/// `benches` directory on its path.
fn is_checked_crate(dir: &Path) -> bool {
    !dir.components().any(|c| match c {
        Component::Normal(name) => name
            .to_str()
            .is_some_and(|n| NOT_CRATE_SOURCES.contains(&n)),
        _ => false,
    })
}

/// The crate that owns `path`: the deepest crate directory above it.
fn owner(crate_dirs: &[PathBuf], path: &Path) -> Option<usize> {
    crate_dirs
        .iter()
        .enumerate()
        .filter(|(_, dir)| path.starts_with(dir))
        .max_by_key(|(_, dir)| dir.components().count())
        .map(|(i, _)| i)
}
