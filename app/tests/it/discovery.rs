//! Plugins found where a build puts them: `tandem` also loads the `libtandem_*` libraries in
//! its own directory (no flag, no `TANDEM_PLUGIN_PATH`), skips a library of a plugin it has
//! built in, lets a plugin directory win over its own directory, and still refuses two
//! libraries with one name in one line.
//!
//! Each test installs the built `tandem` (a hard link of `target/<profile>/tandem`, a copy
//! across file systems) in a fresh directory with copies of chosen libraries, so what lies
//! next to the binary is exactly what the test put there. Needs `cargo build --workspace`
//! (the `native` cdylib and the fixture plugins).

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `tandem` installed alone in a scratch directory together with `libs` (source, file name).
struct Install {
    dir: tempfile::TempDir,
    exe: PathBuf,
}

impl Install {
    fn new(libs: &[(&Path, &str)]) -> Install {
        // Under target/ so a hard link works (same file system): no written copy of the
        // binary, so no "text file busy" when another test thread forks while it is open.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let exe = dir.path().join("tandem");
        let built = Path::new(env!("CARGO_BIN_EXE_tandem"));
        if std::fs::hard_link(built, &exe).is_err() {
            std::fs::copy(built, &exe).unwrap();
        }
        for (src, name) in libs {
            std::fs::copy(src, dir.path().join(name)).unwrap();
        }
        Install { dir, exe }
    }

    /// The installed binary with `args`, `TANDEM_PLUGIN_PATH` unset unless `plugin_path`.
    fn run(&self, args: &[&str], plugin_path: Option<&Path>) -> Output {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args).env_remove("TANDEM_PLUGIN_PATH");
        if let Some(p) = plugin_path {
            cmd.env("TANDEM_PLUGIN_PATH", p);
        }
        run(&mut cmd)
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// `native` (built into the binary), `fixture-alpha` renamed `libtandem_fixture_alpha.so`
/// and `fixture-beta` renamed `libfixture_beta.so` (no `libtandem_` prefix).
fn standard_install() -> Install {
    Install::new(&[
        (&cdylib("tandem_native"), "libtandem_native.so"),
        (&cdylib("fixture_alpha"), "libtandem_fixture_alpha.so"),
        (&cdylib("fixture_beta"), "libfixture_beta.so"),
    ])
}

/// `tandem plugins --json` → (name, source) per plugin, in listing order.
fn listed(out: &Output) -> Vec<(String, String)> {
    assert!(out.status.success(), "{}", stderr(out));
    stdout(out)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            (
                v["name"].as_str().unwrap().to_owned(),
                v["source"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn source_of<'a>(plugins: &'a [(String, String)], name: &str) -> Option<&'a str> {
    plugins
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, s)| s.as_str())
}

#[test]
fn libtandem_libraries_next_to_the_binary_are_found_and_a_built_in_wins() {
    let install = standard_install();
    let out = install.run(&["plugins", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(error_lines(&out).is_empty(), "{}", stderr(&out));
    let plugins = listed(&out);
    let names: Vec<&str> = plugins.iter().map(|(n, _)| n.as_str()).collect();
    // `bridges`, `envs` and `native` once, built in (native's cdylib beside the binary is
    // skipped, not a duplicate); alpha from the binary's directory; beta (no `libtandem_`
    // prefix) not at all.
    assert_eq!(
        names,
        ["bridges", "envs", "native", "fixture-alpha"],
        "{plugins:?}"
    );
    assert_eq!(source_of(&plugins, "native"), Some("built-in"));
    assert_eq!(source_of(&plugins, "bridges"), Some("built-in"));
    assert_eq!(
        source_of(&plugins, "fixture-alpha"),
        Some(install.path("libtandem_fixture_alpha.so").as_str())
    );
    // The skip is a debug line, not a warning or an error.
    let out = install.run(&["plugins", "-vv"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.contains("DEBUG") && l.contains("built-in") && l.contains("native")),
        "{err}"
    );
}

#[test]
fn tandem_plugin_path_adds_any_library_to_those_next_to_the_binary() {
    let install = standard_install();
    let beta = plugin_dir(&[(&cdylib("fixture_beta"), "libfixture_beta.so")]);
    let plugins = listed(&install.run(&["plugins", "--json"], Some(beta.path())));
    assert_eq!(
        source_of(&plugins, "fixture-beta"),
        Some(
            beta.path()
                .join("libfixture_beta.so")
                .display()
                .to_string()
                .as_str()
        ),
        "{plugins:?}"
    );
    assert!(
        source_of(&plugins, "fixture-alpha").is_some(),
        "{plugins:?}"
    );
    assert_eq!(source_of(&plugins, "native"), Some("built-in"));
}

#[test]
fn a_plugin_dir_holding_the_binarys_own_build_loads_without_a_duplicate() {
    // `tandem plugins --plugin-dir target/release` (the issue): the directory is the binary's
    // own, so every library in it loads once, and the `native` cdylib is skipped.
    let install = standard_install();
    let dir = install.dir.path().display().to_string();
    let plugins = listed(&install.run(&["plugins", "--json", "--plugin-dir", &dir], None));
    let mut names: Vec<&str> = plugins.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["bridges", "envs", "fixture-alpha", "fixture-beta", "native"],
        "{plugins:?}"
    );
    assert_eq!(source_of(&plugins, "native"), Some("built-in"));
}

#[test]
fn a_plugin_dir_wins_over_the_binarys_directory() {
    let install = standard_install();
    let alpha = plugin_dir(&[(&cdylib("fixture_alpha"), "libmy_alpha.so")]);
    let dir = alpha.path().display().to_string();
    let plugins = listed(&install.run(&["plugins", "--json", "--plugin-dir", &dir], None));
    let alphas: Vec<&(String, String)> = plugins
        .iter()
        .filter(|(n, _)| n == "fixture-alpha")
        .collect();
    assert_eq!(alphas.len(), 1, "{plugins:?}");
    assert_eq!(
        alphas[0].1,
        alpha.path().join("libmy_alpha.so").display().to_string()
    );
}

/// One `error:` line naming both libraries of `fixture-beta`.
fn assert_one_duplicate_line(out: &Output, first: &str, second: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
    let errors = error_lines(out);
    assert_eq!(errors.len(), 1, "{}", stderr(out));
    let line = &errors[0];
    assert!(
        line.contains("two plugins are named `fixture-beta`"),
        "{line}"
    );
    assert!(line.contains(first) && line.contains(second), "{line}");
    assert!(line.contains("help:"), "{line}");
}

#[test]
fn two_libraries_with_one_name_in_plugin_dirs_are_still_one_error_line() {
    let install = standard_install();
    let beta = cdylib("fixture_beta");
    let d1 = plugin_dir(&[(&beta, "libtandem_fixture_beta.so")]);
    let d2 = plugin_dir(&[(&beta, "libbeta_copy.so")]);
    let first = d1.path().join("libtandem_fixture_beta.so");
    let second = d2.path().join("libbeta_copy.so");
    let (d1s, d2s) = (
        d1.path().display().to_string(),
        d2.path().display().to_string(),
    );
    let out = install.run(
        &["plugins", "--plugin-dir", &d1s, "--plugin-dir", &d2s],
        None,
    );
    assert_one_duplicate_line(
        &out,
        &first.display().to_string(),
        &second.display().to_string(),
    );
}

#[test]
fn two_libraries_with_one_name_next_to_the_binary_are_one_error_line() {
    let beta = cdylib("fixture_beta");
    let install = Install::new(&[
        (&beta, "libtandem_beta_a.so"),
        (&beta, "libtandem_beta_b.so"),
    ]);
    let out = install.run(&["plugins"], None);
    assert_one_duplicate_line(
        &out,
        &install.path("libtandem_beta_a.so"),
        &install.path("libtandem_beta_b.so"),
    );
}
