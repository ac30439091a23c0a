//! The `python` environment component with a real interpreter: a tiny class written into the
//! test's job directory answers `describe`, `item` and `score` through the pool, its items
//! are a function of `(seed, split, index)`, and it is only checked (nothing imported,
//! nothing started) when the run directory is empty.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use common::{TINY_ENV, build_env, env_config, ok, python, write_module};
use tandem_plugin_api::{
    CompletionText, EnvItem, EnvironmentConfig, RString, RewardStatus, ScoreSample,
};

/// The config of the `python` environment over `tiny:Tiny` with `extra` options, 4 held out.
fn tiny(extra: &str) -> EnvironmentConfig {
    let dir = tempfile::tempdir().unwrap().keep();
    write_module(&dir, "tiny", TINY_ENV);
    let options = format!(
        r#"{{"class": "tiny:Tiny", "options": {{"n": 50}}, "python": {:?}{extra}}}"#,
        python().display().to_string()
    );
    env_config(&options, &dir, 4)
}

fn answer(item: &EnvItem, text: &str) -> ScoreSample {
    ScoreSample {
        item: item.clone(),
        completion: CompletionText {
            text: text.into(),
            token_ids: Default::default(),
            finished: true,
        },
    }
}

#[test]
fn items_and_scores_come_from_the_class() {
    let env = build_env(&tiny(""));
    let info = env.describe().unwrap();
    assert_eq!(info.splits[0].size, 50);
    assert_eq!(info.splits[1].name.as_str(), "held_out");
    assert_eq!(info.splits[1].size, 4);
    assert_eq!(info.components[0].as_str(), "exact");
    let item = env.item(RString::from("train"), 7).unwrap();
    assert_eq!(
        (item.id.as_str(), item.prompt.as_str()),
        ("train-7", "say 10")
    );
    assert_eq!(item.metadata_json.as_str(), r#"{"index":7}"#);
    let held = env.item(RString::from("held_out"), 1).unwrap();
    assert_eq!(held.answer.as_str(), "1004");
    let out = env
        .score(vec![answer(&item, "10"), answer(&item, "11")].into())
        .unwrap();
    assert_eq!((ok(&out[0]), ok(&out[1])), (1.0, 0.0));
    assert_eq!(out[0].components[0].name.as_str(), "exact");
}

#[test]
fn items_are_the_same_from_every_worker_and_every_instance() {
    let config = tiny("");
    let (a, b) = (build_env(&config), build_env(&config));
    for i in 0..6 {
        // Round robin: consecutive items come from different workers of `a`.
        let x = a.item(RString::from("train"), i).unwrap();
        let y = b.item(RString::from("train"), i).unwrap();
        assert_eq!(x, y);
    }
}

#[test]
fn an_item_that_raises_is_an_error_naming_the_exception() {
    let env = build_env(&tiny(""));
    let e = env.item(RString::from("nope"), 0).unwrap_err();
    assert!(
        e.message.contains("raised ValueError: no split 'nope'"),
        "{e}"
    );
    let e = env.item(RString::from("held_out"), 4).unwrap_err();
    assert!(e.message.contains("IndexError"), "{e}");
    assert_eq!(
        env.item(RString::from("train"), 0).unwrap().id.as_str(),
        "train-0"
    );
}

#[test]
fn a_score_outside_the_declared_range_fails() {
    let env = build_env(&tiny(r#", "reward_range": [0, 0.5]"#));
    let item = env.item(RString::from("train"), 0).unwrap();
    let out = env
        .score(vec![answer(&item, item.answer.as_str())].into())
        .unwrap();
    assert_eq!(out[0].status, RewardStatus::Failed);
    assert!(
        out[0]
            .reason
            .contains("outside the declared reward range [0, 0.5]"),
        "{:?}",
        out[0]
    );
}

#[test]
fn a_class_that_does_not_build_is_one_error_naming_the_exception() {
    let mut config = tiny("");
    config.options_json = format!(
        r#"{{"class": "tiny:Tiny", "options": {{"colour": 1}}, "python": {:?}}}"#,
        python().display().to_string()
    )
    .into();
    let e = tandem_plugin_envs::python::env::build(&config)
        .err()
        .unwrap();
    assert!(
        e.message.contains("TypeError") && e.message.contains("colour"),
        "{e}"
    );
}

#[test]
fn only_checking_imports_nothing_but_checks_the_options_and_the_interpreter() {
    let mut config = tiny("");
    config.run_dir = "".into();
    let check = |json: &str| {
        let mut c = config.clone();
        c.options_json = json.into();
        tandem_plugin_envs::python::env::build(&c)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let py = python().display().to_string();
    let built = check(&format!(
        r#"{{"class": "no_such_module:Nope", "python": {py:?}}}"#
    ));
    assert!(built.is_ok(), "a check imports nothing: {built:?}");
    let e = check(r#"{"class": "m:C", "python": "/nonexistent/tandem/python"}"#).unwrap_err();
    assert!(
        e.contains("/nonexistent/tandem/python") && e.contains("does not exist"),
        "{e}"
    );
    let e = check(&format!(
        r#"{{"class": "m:C", "workers": 0, "python": {py:?}}}"#
    ))
    .unwrap_err();
    assert!(e.contains("workers = 0"), "{e}");
    let e = check(r#"{"class": "no_colon"}"#).unwrap_err();
    assert!(e.contains("is not \"module:name\""), "{e}");
    let e = check(r#"{"class": "m:C", "wokers": 2}"#).unwrap_err();
    assert!(e.contains("unknown option `wokers`"), "{e}");
}
