//! Plugins built against another version of `tandem-plugin-api`, or declaring an API level
//! below the host's minimum, are refused with one line; a plugin built before the root
//! module's appended `validate_config` (API level 1) still loads and its jobs validate; a
//! plugin built before the role traits' appended hidden-state methods (API level 2) still
//! loads; a bridge built before the bridge methods (API level 3) is refused by `tandem check`
//! in one line, and one built against another API version by the loader; one built before
//! environments (API level 5) lists none. The plugins are
//! real: the fixture is rebuilt against a copy of `plugin-api/` whose
//! version is changed (or whose appended items are cut out), in a scratch workspace under
//! `target/abi-skew` (incremental across runs).

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;
use std::path::{Path, PathBuf};

mod build;
use build::*;

#[test]
fn plugins_built_against_other_api_versions_or_levels_are_refused_in_one_line() {
    let out_dir = tempfile::tempdir().unwrap();
    // Built sequentially: they share one scratch target dir.
    let newer = build_skewed_fixture("0.2.0", None, out_dir.path());
    let older = build_skewed_fixture("0.0.9", None, out_dir.path());
    let old_level = build_skewed_fixture("0.1.0", Some(0), out_dir.path());

    for (lib, found) in [(&newer, "0.2.0"), (&older, "0.0.9")] {
        let dir = plugin_dir(&[(lib, "libtandem_fixture_alpha.so")]);
        let out = run(tandem().args(["plugins", "--plugin-dir"]).arg(dir.path()));
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(
            err.lines().count(),
            1,
            "one line only, not a layout dump:\n{err}"
        );
        assert!(err.contains("plugin `tandem_fixture_alpha`"), "{err}");
        assert!(err.contains("libtandem_fixture_alpha.so"), "{err}");
        assert!(
            err.contains(&format!(
                "built against tandem-plugin-api {found}, this host needs 0.1.x"
            )),
            "{err}"
        );
    }

    let dir = plugin_dir(&[(&old_level, "libtandem_fixture_alpha.so")]);
    let out = run(tandem().args(["plugins", "--plugin-dir"]).arg(dir.path()));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("API level 0 is older than the minimum 1"),
        "{err}"
    );

    // The full abi_stable report is still there at debug level.
    let dir = plugin_dir(&[(&newer, "libtandem_fixture_alpha.so")]);
    let out = run(tandem()
        .args(["plugins", "-vv", "--plugin-dir"])
        .arg(dir.path()));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("full report"), "{}", stderr(&out));
}

/// A job in `dir` whose engine is `fixture-alpha` beside the native trainer, through the
/// `checkpoint` bridge.
fn fixture_engine_job(dir: &Path) -> PathBuf {
    let job = dir.join("job.toml");
    std::fs::write(
        &job,
        "[model]\npath = \"model\"\ninit_preset = \"tiny\"\n\n\
         [engine]\nplugin = \"fixture-alpha\"\n\n[engine.options]\nbehaviour = \"ok\"\n\n\
         [trainer]\nplugin = \"native\"\n\n[bridge]\nmode = \"checkpoint\"\n",
    )
    .unwrap();
    job
}

#[test]
fn a_plugin_without_validate_config_still_loads_and_its_job_validates() {
    let out_dir = tempfile::tempdir().unwrap();
    let old = build_fixture("0.1.0", Some(1), 1, out_dir.path());
    let plugins = plugin_dir(&[(&old, "libtandem_fixture_alpha.so")]);

    let out = run(tandem()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(plugins.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let alpha = listed
        .iter()
        .find(|p| p["name"] == "fixture-alpha")
        .unwrap_or_else(|| panic!("fixture-alpha listed: {}", stdout(&out)));
    assert_eq!(alpha["api_level"], 1);

    // Its options are not checked up front (it cannot be asked): the job validates, and the
    // host says at debug level why it skipped the plugin.
    let jobs = tempfile::tempdir().unwrap();
    let job = fixture_engine_job(jobs.path());
    let out = run(tandem()
        .args(["check", "-vv", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("is valid"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("is at API level 1 (validate_config needs 2)"),
        "{}",
        stderr(&out)
    );

    // A plugin that claims level 2 without the field: the host reads the field as absent
    // (the library's own field count), it does not call past the end of the module.
    let odd = build_fixture("0.1.0", Some(2), 1, out_dir.path());
    let plugins = plugin_dir(&[(&odd, "libtandem_fixture_alpha.so")]);
    let out = run(tandem()
        .args(["check", "-vv", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("declares API level 2 but its root module has no validate_config"),
        "{}",
        stderr(&out)
    );
}

/// Built before the root module's `describe_config` and the trainer's `train_step_policy`
/// (API level 4): it loads, its job checks, the plan describes its engine by its manifest,
/// and its trainer, served by a real worker, answers `train_step_policy` with the trait's
/// default (`NotSupported`) and keeps serving.
#[test]
fn a_plugin_built_before_describe_config_still_loads_and_is_described_by_its_manifest() {
    let out_dir = tempfile::tempdir().unwrap();
    let old = build_fixture("0.1.0", None, 4, out_dir.path());
    let plugins = plugin_dir(&[(&old, "libtandem_fixture_alpha.so")]);
    let jobs = tempfile::tempdir().unwrap();
    let job = fixture_engine_job(jobs.path());
    let out = run(tandem()
        .args(["check", "--json", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job));
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(plan["engine"]["api_level"], 4, "{plan}");
    assert_eq!(plan["engine"]["caps"]["source"], "manifest", "{plan}");
    assert_eq!(plan["trainer"]["caps"]["source"], "options", "{plan}"); // the built-in one
    let run_dir = tempfile::tempdir().unwrap();
    let mut opts = tandem_runtime::launch::LaunchOptions::new(run_dir.path());
    opts.exe = Some(env!("CARGO_BIN_EXE_tandem").into());
    let mut launcher = tandem_runtime::launch::LocalLauncher::new(opts).unwrap();
    let spec = tandem_runtime::worker::WorkerSpec::single_cpu(
        tandem_control::Role::Trainer,
        "fixture-alpha",
        Path::new(""),
        r#"{"behaviour": "ok"}"#,
        run_dir.path(),
        vec![plugins.path().to_path_buf()],
    );
    let trainer = launcher.spawn_trainers(&[spec]).unwrap().pop().unwrap();
    assert!(trainer.init().is_ok(), "the level-4 trainer initialises");
    let batch = tandem_plugin_api::TrainBatch {
        sequences: tandem_plugin_api::RVec::new(),
        loss: tandem_plugin_api::LossConfig {
            kind: tandem_plugin_api::LossKind::Grpo,
            clip_eps_low: 0.2,
            clip_eps_high: 0.2,
            kl_coef: 0.0,
            learning_rate: 1e-3,
            grad_clip: 1.0,
        },
    };
    match trainer.train_step_policy(batch, tandem_plugin_api::PolicyLoss::default()) {
        Err(tandem_runtime::RuntimeError::Plugin { source, .. }) => {
            assert_eq!(
                source.code,
                tandem_plugin_api::ErrorCode::NotSupported,
                "{source:?}"
            );
            assert!(source.message.contains("train_step_policy"), "{source:?}");
        }
        other => panic!("expected a NotSupported plugin error, got {other:?}"),
    }
    assert!(trainer.stats().is_ok(), "the trainer keeps serving");
    launcher
        .shutdown(std::time::Duration::from_secs(10))
        .unwrap();
}

#[test]
fn a_plugin_built_before_the_hidden_state_methods_still_loads() {
    let out_dir = tempfile::tempdir().unwrap();
    let old = build_fixture("0.1.0", None, 2, out_dir.path());
    let plugins = plugin_dir(&[(&old, "libtandem_fixture_alpha.so")]);
    let out = run(tandem()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(plugins.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let alpha = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|p| p["name"] == "fixture-alpha")
        .unwrap_or_else(|| panic!("fixture-alpha listed: {}", stdout(&out)));
    assert_eq!(alpha["api_level"], 2);

    // Its engine, served by a real worker: the appended method it lacks runs the trait's
    // default (a NotSupported error reply), it never calls past the end of the vtable, and
    // the engine keeps serving.
    let run_dir = tempfile::tempdir().unwrap();
    let mut opts = tandem_runtime::launch::LaunchOptions::new(run_dir.path());
    opts.exe = Some(env!("CARGO_BIN_EXE_tandem").into());
    let mut launcher = tandem_runtime::launch::LocalLauncher::new(opts).unwrap();
    let spec = tandem_runtime::worker::WorkerSpec::single_cpu(
        tandem_control::Role::Engine,
        "fixture-alpha",
        Path::new(""),
        r#"{"behaviour": "ok"}"#,
        run_dir.path(),
        vec![plugins.path().to_path_buf()],
    );
    let engine = launcher.spawn_engines(&[spec]).unwrap().pop().unwrap();
    let request = tandem_plugin_api::HiddenStatesRequest {
        sequences: vec![tandem_plugin_api::RVec::from(vec![1u32, 2])].into(),
        layers: vec![0u32].into(),
        adapter: None.into(),
        route: tandem_plugin_api::FeatureRoute::Inline,
    };
    match engine.hidden_states(request) {
        Err(tandem_runtime::RuntimeError::Plugin { source, .. }) => {
            assert_eq!(
                source.code,
                tandem_plugin_api::ErrorCode::NotSupported,
                "{source:?}"
            );
            assert!(source.message.contains("hidden_states"), "{source:?}");
        }
        other => panic!("expected a NotSupported plugin error, got {other:?}"),
    }
    assert!(engine.health().is_ok(), "the engine keeps serving");
    launcher
        .shutdown(std::time::Duration::from_secs(10))
        .unwrap();
}

#[test]
fn a_bridge_built_before_the_bridge_methods_or_against_another_api_is_refused_in_one_line() {
    let out_dir = tempfile::tempdir().unwrap();
    let jobs = tempfile::tempdir().unwrap();
    let job = jobs.path().join("job.toml");
    std::fs::write(
        &job,
        "[model]\npath = \"model\"\ninit_preset = \"tiny\"\n\n\
         [engine]\nplugin = \"native\"\n\n[trainer]\nplugin = \"native\"\n\n\
         [bridge]\nplugin = \"lossy\"\n\n[bridge.options]\nbucket_mb = 1.0\n\
         damage_bucket = 0\ndamage = \"flip\"\n",
    )
    .unwrap();
    // Built before `plan`/`send` (level 3): it loads (it is listed), and the job choosing it
    // is refused by the check, in one line.
    let old = build(Fixture::Lossy, "0.1.0", None, 3, out_dir.path());
    let plugins = plugin_dir(&[(&old, "libtandem_fixture_lossy.so")]);
    let out = run(tandem()
        .args(["plugins", "--plugin-dir"])
        .arg(plugins.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("bridge  lossy"), "{}", stdout(&out));
    let out = run(tandem()
        .args(["check", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "bridge `lossy` of plugin `fixture-lossy` is at API level 3; bridges need level 4"
        ),
        "{err}"
    );
    // Built against another version of the API: the loader refuses the library itself.
    let newer = build(Fixture::Lossy, "0.2.0", None, CURRENT, out_dir.path());
    let plugins = plugin_dir(&[(&newer, "libtandem_fixture_lossy.so")]);
    let out = run(tandem()
        .args(["check", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("built against tandem-plugin-api 0.2.0, this host needs 0.1.x"),
        "{err}"
    );
}

/// A bridge built before the level-7 calls (API level 6: `trainer_side` / `send` /
/// `engine_side` only) still loads, checks and drives a real sync through the defaults that
/// adapt its calls: the `lossy` fixture's buckets reach the engine over the transport, whose
/// refusal of the damaged one is the run's error — one line, the engine named once, one help.
#[test]
fn a_bridge_built_before_the_level_7_calls_still_syncs_through_its_level_4_calls() {
    let out_dir = tempfile::tempdir().unwrap();
    let old = build(Fixture::Lossy, "0.1.0", None, 6, out_dir.path());
    let plugins = plugin_dir(&[(&old, "libtandem_fixture_lossy.so")]);
    let jobs = tempfile::tempdir().unwrap();
    let job = jobs.path().join("job.toml");
    std::fs::write(
        &job,
        "[model]\npath = \"model\"\ninit_preset = \"tiny\"\n\n\
         [engine]\nplugin = \"native\"\n\n[trainer]\nplugin = \"native\"\n\n\
         [run]\nsteps = 1\n\n\
         [bridge]\nplugin = \"lossy\"\n\n[bridge.options]\nbucket_mb = 1.0\n\
         damage_bucket = 0\ndamage = \"flip\"\n",
    )
    .unwrap();
    let out = run(tandem()
        .args(["plugins", "--plugin-dir"])
        .arg(plugins.path()));
    assert!(
        stdout(&out).contains("fixture-lossy 0.1.0 (API level 6"),
        "{}",
        stdout(&out)
    );
    let out = run(tandem()
        .args(["check", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(tandem()
        .args(["run", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job)
        .current_dir(jobs.path()));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("lossy bridge: engine rank 0")
            && last.contains("its checksum does not match"),
        "{err}"
    );
    assert_eq!(last.matches("engine rank 0").count(), 1, "{last}");
    assert_eq!(last.matches("(help:").count(), 1, "{last}");
}

/// A plugin built before environments (API level 5) loads, lists none, and its job checks;
/// the built-in environments are listed beside it.
#[test]
fn a_plugin_built_before_environments_still_loads_and_lists_none() {
    let out_dir = tempfile::tempdir().unwrap();
    let old = build_fixture("0.1.0", None, 5, out_dir.path());
    let plugins = plugin_dir(&[(&old, "libtandem_fixture_alpha.so")]);
    let out = run(tandem()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(plugins.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let views: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let alpha = views.iter().find(|v| v["name"] == "fixture-alpha").unwrap();
    assert_eq!(alpha["api_level"], 5);
    assert!(alpha.get("environments").is_none(), "{alpha}");
    let envs = views.iter().find(|v| v["name"] == "envs").unwrap();
    assert!(
        envs["environments"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "arithmetic"),
        "{envs}"
    );
    let jobs = tempfile::tempdir().unwrap();
    let job = fixture_engine_job(jobs.path());
    let out = run(tandem()
        .args(["check", "--plugin-dir"])
        .arg(plugins.path())
        .arg(&job));
    assert!(out.status.success(), "{}", stderr(&out));
}
