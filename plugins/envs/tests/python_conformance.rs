//! The `python` environment against the environment contract (`tandem-conformance`'s
//! `environment` group), reached through the `envs` plugin's root module as the host reaches
//! it: a tiny class written into the test's job directory, and reasoning-gym
//! (`tandem_envs.reasoning_gym_env:ReasoningGym`, skipped with a printed reason when the
//! interpreter lacks it). One worker each, so the many instances the checks build start fast.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use common::{TINY_ENV, imports, python, write_module};
use tandem_conformance::{EnvironmentSetup, Source};
use tandem_plugin_api::sdk::module_of;
use tandem_plugin_envs::EnvsPlugin;

/// The `python` environment with `options` (a JSON object's fields after `python`), seed 3
/// and `held_out` held-out items, its job directory holding `tiny.py`.
fn setup_of(options: &str, held_out: u32) -> EnvironmentSetup {
    let dir = tempfile::tempdir().unwrap().keep();
    write_module(&dir, "tiny", TINY_ENV);
    let options = format!(
        r#"{{"python": {:?}, "workers": 1, {options}}}"#,
        python().display().to_string()
    );
    EnvironmentSetup::new(Source::Module(module_of::<EnvsPlugin>()), "python")
        .options(&options)
        .base_dir(dir)
        .seed(3)
        .held_out(held_out)
}

fn tiny() -> EnvironmentSetup {
    setup_of(r#""class": "tiny:Tiny", "options": {"n": 100}"#, 8)
}

mod tiny_class {
    tandem_conformance::suite! {
        environment: super::tiny(),
        checks: [environment],
    }
}

#[test]
#[ignore = "needs the venv of scripts/setup-python.sh (reasoning-gym, math-verify): .ci/run runs it with --ignored"]
fn reasoning_gym_passes_the_environment_contract() {
    assert!(
        imports("reasoning_gym"),
        "run `bash scripts/setup-python.sh` first"
    );
    let setup = setup_of(
        r#""class": "tandem_envs.reasoning_gym_env:ReasoningGym",
           "options": {"tasks": ["leg_counting", "basic_arithmetic"], "size": 100}"#,
        8,
    );
    let failures = tandem_conformance::environment_failures(&setup);
    assert!(failures.is_empty(), "{failures:?}");
}
