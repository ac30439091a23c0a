//! `examples/out-of-tree-plugin` is a separate crate depending on `tandem-plugin-api` by path
//! only; it builds on its own and `tandem plugins --plugin-dir` lists it.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;

#[test]
fn out_of_tree_example_builds_and_is_listed() {
    let root = workspace_root();
    let manifest = root.join("examples/out-of-tree-plugin/Cargo.toml");
    let target = root.join("target/out-of-tree");
    let status = cargo()
        .args(["build", "--offline", "-q", "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the out-of-tree example failed");
    let lib = target.join("debug/libtandem_example_reverse.so");
    let dir = plugin_dir(&[(&lib, "libtandem_example_reverse.so")]);
    let out = run(tandem().args(["plugins", "--plugin-dir"]).arg(dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("example-reverse 0.1.0"), "{text}");
    assert!(text.contains("engine  reverse"), "{text}");
}

#[test]
fn out_of_tree_example_passes_the_conformance_suite() {
    let root = workspace_root();
    let manifest = root.join("examples/out-of-tree-plugin/Cargo.toml");
    let out = cargo()
        .args([
            "test",
            "--offline",
            "-q",
            "--test",
            "conformance",
            "--manifest-path",
        ])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", root.join("target/out-of-tree"))
        .output()
        .expect("run cargo");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("8 passed; 0 failed"), "{text}");
}
