//! The plugin loader's failure matrix, on real `.so` files: a good plugin, constructor error,
//! constructor panic, not-a-plugin files, duplicate names, and two plugins of one interface in
//! one process (which must not alias — the abi_stable root-module caching trap).

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;
use std::path::Path;
use tandem_plugin_api::{
    ComponentConfig, ErrorCode, GenerateRequest, RResult, RVec, SamplingParams,
};
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;
use tandem_services::Services;

fn config(component: &str, options_json: &str) -> ComponentConfig {
    cpu_config(component, Path::new(""), options_json, Path::new(""))
}

fn alpha_beta_dir() -> tempfile::TempDir {
    plugin_dir(&[
        (&cdylib("fixture_alpha"), "libtandem_fixture_alpha.so"),
        (&cdylib("fixture_beta"), "libtandem_fixture_beta.so"),
    ])
}

/// Asserts that `err` is a plugin's error with `code` and a message containing `text`.
fn assert_plugin_error(err: &RuntimeError, code: ErrorCode, text: &str) {
    match err {
        RuntimeError::Plugin { source, .. } => {
            assert_eq!(source.code, code);
            assert!(source.message.contains(text), "{err}");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn good_plugin_is_listed_with_its_path_and_capabilities() {
    let dir = alpha_beta_dir();
    let out = run(tandem()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let views: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let alpha = views
        .iter()
        .find(|v| v["name"] == "fixture-alpha")
        .expect("fixture-alpha listed");
    assert_eq!(alpha["api_level"], tandem_plugin_api::API_LEVEL);
    assert!(
        alpha["source"]
            .as_str()
            .is_some_and(|s| s.ends_with("libtandem_fixture_alpha.so"))
    );
    let kinds: Vec<&str> = alpha["components"]
        .as_array()
        .expect("components")
        .iter()
        .map(|c| c["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds, ["engine", "trainer"]);
    assert_eq!(alpha["components"][0]["update_kinds"][0], "checkpoint_dir");
}

#[test]
fn two_plugins_of_one_interface_do_not_alias() {
    let dir = alpha_beta_dir();
    let registry = Registry::discover(&[dir.path().to_path_buf()]).expect("discover");
    let host = Services::new();
    let alpha = registry
        .new_engine(config("fixture-alpha", "{}"), host.handle())
        .expect("alpha engine");
    let beta = registry
        .new_engine(config("fixture-beta", "{}"), host.handle())
        .expect("beta engine");
    let request = GenerateRequest {
        prompts: RVec::from(vec![RVec::from(vec![1u32, 2, 3])]),
        sampling: SamplingParams::default(),
        adapter: tandem_plugin_api::ROption::RNone,
    };
    let a = alpha.generate(request.clone()).unwrap();
    let b = beta.generate(request).unwrap();
    assert_eq!(a.completions[0].tokens.as_slice(), &[1001, 1002, 1003]);
    assert_eq!(b.completions[0].tokens.as_slice(), &[2001, 2002, 2003]);
    assert_eq!(alpha.health().unwrap().detail.as_str(), "fixture-alpha");
    assert_eq!(beta.health().unwrap().detail.as_str(), "fixture-beta");
}

#[test]
fn constructor_error_is_reported_with_the_plugins_message() {
    let dir = alpha_beta_dir();
    let registry = Registry::discover(&[dir.path().to_path_buf()]).expect("discover");
    let err = registry
        .new_engine(
            config("fixture-alpha", r#"{"behaviour": "error"}"#),
            Services::new().handle(),
        )
        .err()
        .expect("constructor must fail");
    assert_plugin_error(&err, ErrorCode::InvalidInput, "told to fail");
    let line = err.to_string();
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(line.contains("fixture-alpha") && line.contains("libtandem_fixture_alpha.so"));
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn constructor_panic_is_caught_and_the_host_survives() {
    let dir = alpha_beta_dir();
    let registry = Registry::discover(&[dir.path().to_path_buf()]).expect("discover");
    let host = Services::new();
    let err = registry
        .new_trainer(
            config("fixture-beta", r#"{"behaviour": "panic"}"#),
            host.handle(),
        )
        .err()
        .expect("constructor must fail");
    assert_plugin_error(&err, ErrorCode::Panicked, "told to panic");
    // The host (this process) is still alive and the same plugin still constructs.
    let mut trainer = registry
        .new_trainer(config("fixture-beta", "{}"), host.handle())
        .expect("second construction works");
    assert!(matches!(trainer.init(), RResult::ROk(_)));
}

#[test]
fn duplicate_plugin_names_are_an_error_naming_both_paths() {
    let alpha = cdylib("fixture_alpha");
    let d1 = plugin_dir(&[(&alpha, "libtandem_fixture_alpha.so")]);
    let d2 = plugin_dir(&[(&alpha, "libalpha_copy.so")]);
    let out = run(tandem()
        .arg("plugins")
        .arg("--plugin-dir")
        .arg(d1.path())
        .arg("--plugin-dir")
        .arg(d2.path()));
    assert_eq!(out.status.code(), Some(2));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(errors[0].contains("two plugins are named `fixture-alpha`"));
    assert!(errors[0].contains(&d1.path().display().to_string()));
    assert!(errors[0].contains(&d2.path().join("libalpha_copy.so").display().to_string()));
}

#[test]
fn files_that_are_not_plugins_get_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("libjunk.so"), b"not an ELF file").unwrap();
    // A real shared library without a Tandem root module: a cdylib of the workspace that
    // is not a plugin is not available, so use the C math library every Linux has.
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libm present");
    std::fs::copy(libm, dir.path().join("libmath.so")).unwrap();
    let out = run(tandem().args(["plugins", "--plugin-dir"]).arg(dir.path()));
    assert_eq!(out.status.code(), Some(2));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 2, "{}", stderr(&out));
    assert!(errors.iter().all(|e| e.contains("not a Tandem plugin")));
    assert!(errors.iter().any(|e| e.contains("libjunk.so")));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("libmath.so") && e.contains("no Tandem root module"))
    );
}

#[test]
fn missing_plugin_dir_is_one_clear_line() {
    let out = run(tandem().args(["plugins", "--plugin-dir", "/nonexistent/tandem-plugins"]));
    assert_eq!(out.status.code(), Some(2));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("/nonexistent/tandem-plugins: cannot read plugin directory"));
}

#[test]
fn plugin_path_env_var_is_searched() {
    let dir = alpha_beta_dir();
    let out = run(tandem()
        .arg("plugins")
        .env("TANDEM_PLUGIN_PATH", dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("fixture-beta"));
}
