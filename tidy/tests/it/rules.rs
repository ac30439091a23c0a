//! Each rule on a small workspace that passes every rule, then with exactly that rule broken:
//! exactly that rule is reported, at the right file and line.

use crate::common;

use std::path::PathBuf;

use common::{Fixture, RS_FILES, found};
use tandem_tidy::{Report, Rule};

fn one(rule: Rule, path: &str, line: Option<usize>) -> Vec<(&'static str, PathBuf, Option<usize>)> {
    vec![(rule.name(), PathBuf::from(path), line)]
}

fn message(report: &Report) -> &str {
    report.violations.first().map_or("", |v| v.message.as_str())
}

#[test]
fn the_fixture_passes_every_rule() {
    let fixture = Fixture::new();
    let report = fixture.check();
    assert_eq!(found(&report), vec![], "{:#?}", report.violations);
    assert_eq!(report.figures.rs_files, RS_FILES);
    let longest = report.figures.longest.clone().expect("a longest file");
    assert_eq!(longest, (PathBuf::from("core/src/lib.rs"), 8));
    assert_eq!(report.figures.median_lines, 5);
}

#[test]
fn module_docs() {
    let fixture = Fixture::new();
    fixture.edit("plug/src/lib.rs", "//! Plugin.", "// Plugin.");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::ModuleDocs, "plug/src/lib.rs", Some(1))
    );

    let fixture = Fixture::new();
    fixture.write("core/src/extra.rs", "\n\nuse std::fmt;\n");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::ModuleDocs, "core/src/extra.rs", Some(3))
    );
    assert!(message(&report).contains("`//!`"), "{}", message(&report));
}

#[test]
fn crate_edges_undeclared_edge() {
    let fixture = Fixture::new();
    let dep = "fx-core = { path = \"../core\" }";
    fixture.edit(
        "plug/Cargo.toml",
        dep,
        &format!("{dep}\nfx-host = {{ path = \"../host\" }}"),
    );
    let line = fixture.line_of("plug/Cargo.toml", "fx-host");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::CrateEdges, "plug/Cargo.toml", Some(line))
    );
    let doc_line = fixture.line_of("ARCHITECTURE.md", "fx-plug ->");
    let hint = format!("add `fx-host` to the `fx-plug ->` line (ARCHITECTURE.md:{doc_line})");
    assert!(message(&report).contains(&hint), "{}", message(&report));
}

#[test]
fn crate_edges_declared_edge_that_does_not_exist() {
    let fixture = Fixture::new();
    fixture.edit(
        "ARCHITECTURE.md",
        "fx-plug -> fx-core",
        "fx-plug -> fx-core fx-host",
    );
    let line = fixture.line_of("ARCHITECTURE.md", "fx-plug ->");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::CrateEdges, "ARCHITECTURE.md", Some(line))
    );
    assert!(message(&report).starts_with("stale edge: `fx-plug -> fx-host`"));
}

#[test]
fn crate_edges_host_depends_on_plugin_even_when_declared() {
    let fixture = Fixture::new();
    let dep = "fx-core = { path = \"../core\" }\n\n[dev-dependencies]";
    fixture.edit(
        "host/Cargo.toml",
        dep,
        &dep.replace("\n\n", "\nfx-plug.path = \"../plug\"\n\n"),
    );
    fixture.edit(
        "ARCHITECTURE.md",
        "fx-host -> fx-core",
        "fx-host -> fx-core fx-plug",
    );
    let line = fixture.line_of("host/Cargo.toml", "fx-plug.path");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::CrateEdges, "host/Cargo.toml", Some(line))
    );
    let text = message(&report);
    assert!(text.starts_with("layer violation"), "{text}");
    assert!(
        text.contains("a host crate must never depend on a plugin crate"),
        "{text}"
    );
}

#[test]
fn crate_edges_block_missing_twice_or_naming_unknown_crates() {
    let fixture = Fixture::new();
    fixture.write("ARCHITECTURE.md", "# Fixture\n\nNo block.\n");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::CrateEdges, "ARCHITECTURE.md", None)
    );

    let fixture = Fixture::new();
    let doc = fixture.read("ARCHITECTURE.md");
    fixture.write("ARCHITECTURE.md", &format!("{doc}\n```crate-edges\n```\n"));
    let second = doc.lines().count() + 2;
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::CrateEdges, "ARCHITECTURE.md", Some(second))
    );

    let fixture = Fixture::new();
    fixture.edit("ARCHITECTURE.md", "fx-plug\n", "fx-plug fx-gone\n");
    let line = fixture.line_of("ARCHITECTURE.md", "fx-gone");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::CrateEdges, "ARCHITECTURE.md", Some(line))
    );
    assert!(message(&report).contains("`fx-gone` is not a workspace member"));
}

#[test]
fn forbid_unsafe() {
    let fixture = Fixture::new();
    fixture.edit("host/src/main.rs", "#![forbid(unsafe_code)]\n", "");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::ForbidUnsafe, "host/src/main.rs", None)
    );
    assert!(message(&report).contains("`#![forbid(unsafe_code)]`"));

    // Unsafe code anywhere in the crate's sources lifts the rule for its roots.
    fixture.write(
        "host/src/ffi.rs",
        "//! FFI.\n\npub fn f() {\n    unsafe { g() }\n}\n",
    );
    fixture.edit("host/src/lib.rs", "#![forbid(unsafe_code)]\n", "");
    assert_eq!(found(&fixture.check()), vec![]);
}

#[test]
fn no_pasted_help() {
    let fixture = Fixture::new();
    fixture.edit(
        "core/src/lib.rs",
        "mod inner;\n",
        "mod inner;\n\npub const BAD: &str = \"out of range (help: use 1..=9)\";\n",
    );
    let line = fixture.line_of("core/src/lib.rs", "BAD");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::NoPastedHelp, "core/src/lib.rs", Some(line))
    );

    // The marker holds for its own line only.
    let fixture = Fixture::new();
    fixture.edit(
        "host/src/main.rs",
        "}\n",
        "    eprintln!(\"second (help: {help})\");\n}\n",
    );
    let line = fixture.line_of("host/src/main.rs", "second");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::NoPastedHelp, "host/src/main.rs", Some(line))
    );
}

#[test]
fn file_length() {
    let fixture = Fixture::new();
    let body = "let x = 1;\n".repeat(499);
    fixture.write("host/tests/long.rs", &format!("//! Long.\n{body}"));
    assert_eq!(found(&fixture.check()), vec![], "500 lines are allowed");

    fixture.write(
        "host/tests/long.rs",
        &format!("//! Long.\n{body}let y = 2;\n"),
    );
    let report = fixture.check();
    assert_eq!(
        found(&report),
        one(Rule::FileLength, "host/tests/long.rs", None)
    );
    assert!(message(&report).starts_with("501 lines (limit 500)"));
    assert_eq!(report.figures.rs_files, RS_FILES + 1);
    let longest = report.figures.longest.clone().expect("a longest file");
    assert_eq!(longest, (PathBuf::from("host/tests/long.rs"), 501));
}

#[test]
fn notes_names() {
    let fixture = Fixture::new();
    fixture.edit(
        "core/src/inner.rs",
        "pub fn f() {}",
        "pub struct NoteType;\n\npub fn f() {}",
    );
    let notes = "# Host notes\n\n\
        Cited from the crate (`src/main.rs`), the root (`core/src/inner.rs`, `plug/`), the\n\
        notes' directory (`../plug/src/lib.rs`); `NoteType` and `NoteType::f()` are code.\n\
        Not names of this tree: `step_000001/model/config.json`, `../../elsewhere/x.md`,\n\
        `/tmp/run/a.rs`, `plugins/*/NOTES.md`, `RSS`, `Registry`, `a/<b>.rs`.\n\n\
        ```\nfenced `FencedGoneType` and `src/fenced_gone.rs` are not read\n```\n\n\
        Another project's `TheirModelType`. <!-- tidy: not-a-name -->\n";
    fixture.write("host/NOTES.md", notes);
    let report = fixture.check();
    assert_eq!(found(&report), vec![], "{:#?}", report.violations);

    fixture.write(
        "host/NOTES.md",
        &format!("{notes}\nStale: `src/gone.rs`.\n\nStale: `NoteType::GoneVariant`.\n"),
    );
    let path_line = fixture.line_of("host/NOTES.md", "src/gone.rs");
    let type_line = fixture.line_of("host/NOTES.md", "GoneVariant");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        vec![
            (
                Rule::NotesNames.name(),
                PathBuf::from("host/NOTES.md"),
                Some(path_line)
            ),
            (
                Rule::NotesNames.name(),
                PathBuf::from("host/NOTES.md"),
                Some(type_line)
            ),
        ]
    );
    let texts: Vec<&str> = report
        .violations
        .iter()
        .map(|v| v.message.as_str())
        .collect();
    assert!(
        texts[0].starts_with("`src/gone.rs` is no file under the repository root, `host/`"),
        "{}",
        texts[0]
    );
    assert!(texts[1].contains("has no `GoneVariant`"), "{}", texts[1]);

    // The root's ARCHITECTURE.md is a notes file too; other `.md` files are not.
    let fixture = Fixture::new();
    fixture.edit(
        "ARCHITECTURE.md",
        "The crate graph:",
        "The crate graph (`host/src/gone.rs`):",
    );
    fixture.write("host/README.md", "`host/src/gone.rs`\n");
    let line = fixture.line_of("ARCHITECTURE.md", "gone.rs");
    assert_eq!(
        found(&fixture.check()),
        one(Rule::NotesNames, "ARCHITECTURE.md", Some(line))
    );
}
