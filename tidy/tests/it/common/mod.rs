//! A small workspace in a temporary directory that passes every rule, for the rule tests to
//! break one rule at a time.
//!
//! Crates: `fx-core` (`core/`, has unsafe code, so no forbid), `fx-host` (`host/`, layer host,
//! lib + bin, a dev-dependency on the plugin), `fx-plug` (`plug/`, layer plugin) and
//! `fx-outside` (`outside/`, excluded from the workspace, depends on both). Only path
//! dependencies: `cargo metadata` needs no registry.

use std::fs;
use std::path::{Path, PathBuf};

use tandem_tidy::{Report, check};
use tempfile::TempDir;

const FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        "[workspace]\nresolver = \"3\"\nmembers = [\"core\", \"host\", \"plug\"]\n\
         exclude = [\"outside\"]\n",
    ),
    (
        "ARCHITECTURE.md",
        "# Fixture\n\nThe crate graph:\n\n```crate-edges\n\
         # A host crate never depends on a plugin crate.\n\
         layer host: fx-host\n\
         layer plugin: fx-plug\n\
         \n\
         fx-host -> fx-core  # the binary's library\n\
         fx-plug -> fx-core\n\
         ```\n",
    ),
    (
        "core/Cargo.toml",
        "[package]\nname = \"fx-core\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    ),
    (
        "core/src/lib.rs",
        "//! Core of the fixture: it has unsafe code, so no forbid is asked of it.\n\n\
         mod inner;\n\n\
         /// Reads a byte.\n\
         pub unsafe fn read(p: *const u8) -> u8 {\n    unsafe { *p }\n}\n",
    ),
    ("core/src/inner.rs", "//! A submodule.\n\npub fn f() {}\n"),
    (
        "host/Cargo.toml",
        "[package]\nname = \"fx-host\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nfx-core = { path = \"../core\" }\n\n\
         [dev-dependencies]\nfx-plug = { path = \"../plug\" }\n",
    ),
    (
        "host/src/lib.rs",
        "//! Host library.\n#![forbid(unsafe_code)]\n\n\
         /// Text, not code.\npub const NOTE: &str = \"unsafe { in a string }\";\n",
    ),
    (
        "host/src/main.rs",
        "//! Host binary: the one place that renders help.\n#![forbid(unsafe_code)]\n\n\
         fn main() {\n    let help = \"try again\";\n    \
         println!(\"failed (help: {help})\"); // tidy: help-format\n}\n",
    ),
    (
        "host/tests/it.rs",
        "#[test]\nfn integration_tests_need_no_module_doc() {}\n",
    ),
    (
        "plug/Cargo.toml",
        "[package]\nname = \"fx-plug\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nfx-core = { path = \"../core\" }\n",
    ),
    (
        "plug/src/lib.rs",
        "//! Plugin.\n#![forbid(unsafe_code)]\n\n// unsafe { in a comment }\npub fn g() {}\n",
    ),
    (
        "outside/Cargo.toml",
        "[package]\nname = \"fx-outside\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nfx-host = { path = \"../host\" }\nfx-plug = { path = \"../plug\" }\n",
    ),
    (
        "outside/src/lib.rs",
        "//! Outside the workspace: its edges are not checked.\n#![forbid(unsafe_code)]\n",
    ),
];

/// The `.rs` files of the fixture (`target/` and hidden directories not counted).
pub const RS_FILES: usize = 7;

/// The fixture tree.
pub struct Fixture {
    dir: TempDir,
}

impl Fixture {
    /// Writes the passing tree, plus files in `target/` and a hidden directory that would break
    /// rules if the walk did not skip them.
    pub fn new() -> Fixture {
        let fixture = Fixture {
            dir: tempfile::tempdir().expect("temporary directory"),
        };
        for (path, text) in FILES {
            fixture.write(path, text);
        }
        let long = "let x = 1;\n".repeat(600);
        fixture.write("target/debug/build/generated.rs", &long);
        fixture.write(".hidden/generated.rs", &long);
        fixture
    }

    /// The root of the tree.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `text` to `rel` (creating directories).
    pub fn write(&self, rel: &str, text: &str) {
        let path = self.root().join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create directory");
        }
        fs::write(&path, text).expect("write file");
    }

    /// Replaces the one occurrence of `from` in `rel` with `to`.
    pub fn edit(&self, rel: &str, from: &str, to: &str) {
        let text = self.read(rel);
        assert_eq!(text.matches(from).count(), 1, "`{from}` once in {rel}");
        self.write(rel, &text.replacen(from, to, 1));
    }

    /// The text of `rel`.
    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.root().join(rel)).expect("read file")
    }

    /// The 1-based line of `rel` that holds `needle` (once).
    pub fn line_of(&self, rel: &str, needle: &str) -> usize {
        let text = self.read(rel);
        let lines: Vec<usize> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(lines.len(), 1, "`{needle}` on one line of {rel}");
        lines[0]
    }

    /// Runs the check.
    pub fn check(&self) -> Report {
        check(self.root()).expect("check runs")
    }
}

/// The violations of `report` as `(rule, path, line)`, for exact comparisons.
pub fn found(report: &Report) -> Vec<(&'static str, PathBuf, Option<usize>)> {
    report
        .violations
        .iter()
        .map(|v| (v.rule.name(), v.path.clone(), v.line))
        .collect()
}
