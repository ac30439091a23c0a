//! The `crate-edges` rule: the edges between workspace crates (from `cargo metadata`) against
//! the block of `ARCHITECTURE.md`, and the layer rule (no `host` crate depends on a `plugin`
//! crate).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use cargo_metadata::{DependencyKind, MetadataCommand};

use crate::block::{EdgesBlock, INFO, parse_block};
use crate::{Rule, TidyError, Violation};

const DOC: &str = "ARCHITECTURE.md";

/// Where an actual edge is declared: the depending crate's manifest and the dependency's line.
#[derive(Debug, Clone)]
struct Origin {
    manifest: PathBuf,
    line: Option<usize>,
}

/// The workspace members and their edges: crate → (dependency → origin).
type Edges = BTreeMap<String, BTreeMap<String, Origin>>;

/// Checks the block of `root/ARCHITECTURE.md` against `cargo metadata` of `root/Cargo.toml`.
pub fn check_edges(root: &Path) -> Result<Vec<Violation>, TidyError> {
    let doc_path = root.join(DOC);
    let markdown = match fs::read_to_string(&doc_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let message = format!("no {DOC} at the root: add one with a ```{INFO} block");
            return Ok(vec![at_doc(None, message)]);
        }
        Err(source) => {
            return Err(TidyError::Io {
                path: doc_path,
                source,
            });
        }
    };
    let (block, problems) = parse_block(&markdown);
    let mut out: Vec<Violation> = problems.into_iter().map(|(l, m)| at_doc(l, m)).collect();
    let Some(block) = block else {
        return Ok(out);
    };
    let actual = workspace_edges(root)?;
    unknown_names(&block, &actual, &mut out);
    for (from, deps) in &actual {
        for (to, origin) in deps {
            if block.layer_of(from) == Some("host") && block.layer_of(to) == Some("plugin") {
                out.push(Violation {
                    rule: Rule::CrateEdges,
                    path: origin.manifest.clone(),
                    line: origin.line,
                    message: format!(
                        "layer violation: `{from}` (layer host) depends on `{to}` (layer \
                         plugin); a host crate must never depend on a plugin crate, even when \
                         {DOC} declares the edge: move what it needs out of the plugin layer"
                    ),
                });
                continue;
            }
            let declared = block.edges.get(from);
            if declared.is_some_and(|d| d.crates.contains(to)) {
                continue;
            }
            let fix = match declared {
                Some(d) => format!("add `{to}` to the `{from} ->` line ({DOC}:{})", d.line),
                None => format!("add the line `{from} -> {to}` to the ```{INFO} block"),
            };
            out.push(Violation {
                rule: Rule::CrateEdges,
                path: origin.manifest.clone(),
                line: origin.line,
                message: format!(
                    "`{from}` depends on `{to}` but {DOC} does not declare the edge: {fix}, \
                     or drop the dependency"
                ),
            });
        }
    }
    for (from, declared) in &block.edges {
        let Some(deps) = actual.get(from) else {
            continue;
        };
        for to in declared.crates.iter().filter(|to| actual.contains_key(*to)) {
            if !deps.contains_key(to) {
                let message = format!(
                    "stale edge: `{from} -> {to}` is declared but `{from}` has no normal or build \
                     dependency on `{to}`: remove `{to}` from this line"
                );
                out.push(at_doc(Some(declared.line), message));
            }
        }
    }
    Ok(out)
}

/// Renders the actual edges of the workspace at `root` as a `crate-edges` block (layers left
/// for a person to write): a start for `ARCHITECTURE.md`, or a check of what it should say.
pub fn edges_block(root: &Path) -> Result<String, TidyError> {
    let root = root.canonicalize().map_err(|source| TidyError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    let mut text = format!("```{INFO}\n");
    for (from, deps) in workspace_edges(&root)? {
        if !deps.is_empty() {
            let deps: Vec<&str> = deps.keys().map(String::as_str).collect();
            text.push_str(&format!("{from} -> {}\n", deps.join(" ")));
        }
    }
    text.push_str("```\n");
    Ok(text)
}

fn at_doc(line: Option<usize>, message: String) -> Violation {
    Violation {
        rule: Rule::CrateEdges,
        path: PathBuf::from(DOC),
        line,
        message,
    }
}

/// Names in the block that are not workspace members (misspelt, or crates that are gone).
fn unknown_names(block: &EdgesBlock, actual: &Edges, out: &mut Vec<Violation>) {
    let lines = block.layers.values().chain(block.edges.values());
    let mut named: BTreeSet<(usize, &str)> = BTreeSet::new();
    for declared in lines {
        named.extend(declared.crates.iter().map(|c| (declared.line, c.as_str())));
    }
    named.extend(block.edges.iter().map(|(c, d)| (d.line, c.as_str())));
    for (line, name) in named {
        if !actual.contains_key(name) {
            let message = format!(
                "`{name}` is not a workspace member (cargo metadata): fix the name or remove it"
            );
            out.push(at_doc(Some(line), message));
        }
    }
}

/// Runs `cargo metadata --no-deps --offline` on `root/Cargo.toml` (`root` canonical): every
/// workspace member and its normal and build dependencies on other members.
fn workspace_edges(root: &Path) -> Result<Edges, TidyError> {
    let manifest = root.join("Cargo.toml");
    let metadata = MetadataCommand::new()
        .manifest_path(&manifest)
        .current_dir(root)
        .no_deps()
        .other_options(vec!["--offline".to_string()])
        .exec()
        .map_err(|source| TidyError::Metadata {
            manifest: manifest.clone(),
            source,
        })?;
    let members = metadata.workspace_packages();
    let names: BTreeSet<&str> = members.iter().map(|p| p.name.as_str()).collect();
    let mut edges = Edges::new();
    for package in &members {
        let manifest_path = package.manifest_path.as_std_path();
        let text = fs::read_to_string(manifest_path).map_err(|source| TidyError::Io {
            path: manifest_path.to_path_buf(),
            source,
        })?;
        let relative = relative_to(root, manifest_path);
        let deps = edges.entry(package.name.to_string()).or_default();
        for dep in &package.dependencies {
            let kind_counts = matches!(dep.kind, DependencyKind::Normal | DependencyKind::Build);
            if !kind_counts || !names.contains(dep.name.as_str()) || deps.contains_key(&dep.name) {
                continue;
            }
            let key = dep.rename.as_deref().unwrap_or(&dep.name);
            let origin = Origin {
                manifest: relative.clone(),
                line: dependency_line(&text, key),
            };
            deps.insert(dep.name.clone(), origin);
        }
    }
    Ok(edges)
}

fn relative_to(root: &Path, path: &Path) -> PathBuf {
    if let Ok(rel) = path.strip_prefix(root) {
        return rel.to_path_buf();
    }
    path.canonicalize()
        .ok()
        .and_then(|p| p.strip_prefix(root).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
}

/// The 1-based line of `Cargo.toml` text that declares the dependency `key` as a normal or
/// build dependency (`key = ...`, `key.workspace = true`, or a `[dependencies.key]` table).
fn dependency_line(manifest: &str, key: &str) -> Option<usize> {
    let mut in_deps = false;
    for (i, line) in manifest.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_matches(|c| c == '[' || c == ']').trim();
            let table = header.rsplit('.').next().unwrap_or_default();
            let parent = header.rsplit('.').nth(1).unwrap_or_default();
            let is_deps = |t: &str| t == "dependencies" || t == "build-dependencies";
            if is_deps(parent) && unquote(table) == key {
                return Some(i + 1);
            }
            in_deps = is_deps(table);
            continue;
        }
        if in_deps {
            let name = line.split(['=', '.']).next().unwrap_or_default();
            if unquote(name.trim()) == key {
                return Some(i + 1);
            }
        }
    }
    None
}

fn unquote(text: &str) -> &str {
    text.trim_matches(|c| c == '"' || c == '\'')
}
