//! Building a fixture plugin against a copy of `plugin-api/` whose version is changed or whose
//! appended items are cut out (`// abi-append:NAME:begin` … `end`), in a scratch workspace
//! under `target/abi-skew`.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;
use std::path::{Path, PathBuf};

pub(super) fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

/// Removes every `// abi-append:NAME:begin` … `// abi-append:NAME:end` block of a file
/// (markers included), i.e. what a later API level appended for `NAME`.
pub(super) fn cut_appended(path: &Path, name: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let (begin, end) = (
        format!("// abi-append:{name}:begin"),
        format!("// abi-append:{name}:end"),
    );
    let mut out = String::new();
    let mut cutting = false;
    let mut cuts = 0;
    for line in text.lines() {
        if line.trim_start().starts_with(&begin) {
            cutting = true;
            cuts += 1;
        } else if line.trim_start().starts_with(&end) {
            cutting = false;
        } else if !cutting {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        cuts > 0 && !cutting,
        "{}: no complete `{begin}` block",
        path.display()
    );
    std::fs::write(path, out).unwrap();
}

/// Builds fixture-alpha against plugin-api stamped `api_version`, with an optional declared
/// API level, and returns the library path (copied out of the scratch target dir).
pub(super) fn build_skewed_fixture(
    api_version: &str,
    api_level: Option<u32>,
    out: &Path,
) -> PathBuf {
    build_fixture(api_version, api_level, CURRENT, out)
}

/// The API level of this checkout (nothing cut out).
pub(super) const CURRENT: u32 = tandem_plugin_api::API_LEVEL;

/// The engine fixture `fixture-alpha` against the API as it was at `api`.
pub(super) fn build_fixture(
    api_version: &str,
    api_level: Option<u32>,
    api: u32,
    out: &Path,
) -> PathBuf {
    build(Fixture::Alpha, api_version, api_level, api, out)
}

/// Which fixture crate to rebuild.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Fixture {
    /// `fixture-alpha`: an engine.
    Alpha,
    /// `fixture-lossy`: a bridge (its appended bridge methods are marked like the API's).
    Lossy,
}

impl Fixture {
    pub(super) fn dir(self) -> &'static str {
        match self {
            Fixture::Alpha => "fixture-alpha",
            Fixture::Lossy => "fixture-lossy",
        }
    }
}

/// A fixture against the API as it was at `api` (1 to 7): level 6 lacks the bridge's
/// appended level-7 calls (`ship` … `stats`, the sink), level 5 also the root module's
/// appended `environments` / `new_environment`, level 4 also the root module's
/// appended `describe_config` and the trainer's appended `train_step_policy`, level 3 also
/// the bridge's appended
/// `plan` / `send`, level 2 also the role traits' appended `hidden_states` / `load_drafter` /
/// `train_step_features` (and their SDK shims), level 1 also the root module's
/// `validate_config`.
pub(super) fn build(
    fixture: Fixture,
    api_version: &str,
    api_level: Option<u32>,
    api: u32,
    out: &Path,
) -> PathBuf {
    // The tests share one scratch target dir: a build and the copy of its library must not
    // interleave with another test's build.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = workspace_root();
    let ws = tempfile::tempdir().unwrap();
    let w = ws.path();
    copy_dir(&root.join("plugin-api"), &w.join("plugin-api"));
    copy_dir(
        &root.join("tests/fixtures/common"),
        &w.join("tests/fixtures/common"),
    );
    let crate_dir = format!("tests/fixtures/{}", fixture.dir());
    copy_dir(&root.join(&crate_dir), &w.join(&crate_dir));
    let manifest = w.join("plugin-api/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let text = text.replacen(
        "version = \"0.1.0\"",
        &format!("version = \"{api_version}\""),
        1,
    );
    std::fs::write(&manifest, text).unwrap();
    let src = w.join("plugin-api/src");
    if api < 7 {
        for file in [
            "traits.rs",
            "sdk/traits.rs",
            "sdk/adapters.rs",
            "sdk.rs",
            "lib.rs",
        ] {
            cut_appended(&src.join(file), "bridge_io");
        }
    }
    if api < 6 {
        cut_appended(&src.join("module.rs"), "environment");
        cut_appended(&src.join("sdk.rs"), "environment");
    }
    if api < 5 {
        cut_appended(&src.join("module.rs"), "describe_config");
        cut_appended(&src.join("sdk.rs"), "describe_config");
        for file in ["traits.rs", "sdk/traits.rs", "sdk/adapters.rs"] {
            cut_appended(&src.join(file), "policy_loss");
        }
    }
    if api < 4 {
        for file in ["traits.rs", "sdk/traits.rs", "sdk/adapters.rs"] {
            cut_appended(&src.join(file), "bridge");
        }
        if fixture == Fixture::Lossy {
            cut_appended(&w.join(&crate_dir).join("src/lib.rs"), "bridge");
        }
    }
    if api < 3 {
        for file in ["traits.rs", "sdk/traits.rs", "sdk/adapters.rs"] {
            cut_appended(&src.join(file), "hidden_states");
        }
    }
    if api < 2 {
        cut_appended(&src.join("module.rs"), "validate_config");
        cut_appended(&src.join("sdk.rs"), "validate_config");
    }
    if api < CURRENT {
        let lib = src.join("lib.rs");
        let text = std::fs::read_to_string(&lib).unwrap();
        let current = "pub const API_LEVEL: u32 = api_level::BRIDGE_IO;";
        assert!(text.contains(current), "plugin-api/src/lib.rs: {current}");
        let level = [
            "",
            "BASE",
            "VALIDATE",
            "HIDDEN",
            "BRIDGE",
            "PLAN",
            "ENVIRONMENT",
        ][api as usize];
        let text = text.replace(
            current,
            &format!("pub const API_LEVEL: u32 = api_level::{level};"),
        );
        std::fs::write(&lib, text).unwrap();
    }
    // `[workspace.dependencies]`: every registry dependency of the root workspace, so whatever
    // plugin-api inherits (dependencies and dev-dependencies, e.g. proptest) resolves; the
    // workspace's own crates (path entries) stay out: plugin-api depends on none of them.
    let root_manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let mut deps = root_manifest["workspace"]["dependencies"]
        .as_table()
        .expect("[workspace.dependencies] in root Cargo.toml")
        .clone();
    deps.retain(|_, v| v.get("path").is_none());
    deps.insert(
        "tandem-plugin-api".into(),
        toml::Value::Table("path = \"plugin-api\"".parse().unwrap()),
    );
    let mut ws_manifest: toml::Table = format!(
        "[workspace]\nresolver = \"3\"\nmembers = [\"plugin-api\", \"{crate_dir}\"]\n\
         [workspace.package]\nedition = \"2024\"\nrust-version = \"1.95\"\nlicense = \"Apache-2.0\"\npublish = false\n\
         [workspace.lints.rust]\n[workspace.lints.clippy]\n"
    )
    .parse()
    .unwrap();
    ws_manifest
        .get_mut("workspace")
        .and_then(toml::Value::as_table_mut)
        .unwrap()
        .insert("dependencies".into(), toml::Value::Table(deps));
    std::fs::write(w.join("Cargo.toml"), ws_manifest.to_string()).unwrap();
    std::fs::copy(root.join("Cargo.lock"), w.join("Cargo.lock")).unwrap();
    let _ = std::fs::copy(
        root.join("rust-toolchain.toml"),
        w.join("rust-toolchain.toml"),
    );
    let target = root.join("target/abi-skew");
    let mut cmd = cargo();
    cmd.current_dir(w)
        .args(["build", "--offline", "-q", "-p"])
        .arg(format!("tandem-{}", fixture.dir()))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("TANDEM_FIXTURE_API_LEVEL");
    if let Some(level) = api_level {
        cmd.env("TANDEM_FIXTURE_API_LEVEL", level.to_string());
    }
    let status = cmd.status().expect("run cargo");
    assert!(status.success(), "building the skewed fixture failed");
    let name = fixture.dir().replace('-', "_");
    let lib = out.join(format!(
        "libskewed_{name}_{}_{}_api{api}.so",
        api_version.replace('.', "_"),
        api_level.unwrap_or(tandem_plugin_api::API_LEVEL),
    ));
    std::fs::copy(target.join(format!("debug/lib{name}.so")), &lib).unwrap();
    lib
}
