//! reasoning-gym and math-verify (python/requirements-envs.lock) through the pool: the
//! `tandem_envs.reasoning_gym_env:ReasoningGym` environment scores a correct answer 1 and a wrong one 0 through each dataset's `score_answer`;
//! `tandem_envs.math_verify_reward:compute_score` (verl's signature) judges equivalent answers
//! equal in the worker's main thread, where math-verify's signal-based timeouts work.
//! They need the venv of `scripts/setup-python.sh` (ignored by default; `.ci/run` runs them).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use common::{build_env, env_config, imports, ok, python, sample};
use tandem_plugin_api::{CompletionText, EnvironmentConfig, RString, ScoreSample};
use tandem_plugin_envs::python::{PoolOptions, PythonReward};

/// reasoning-gym's leg_counting and basic_arithmetic, 200 each, 8 held out.
fn gym() -> EnvironmentConfig {
    let dir = tempfile::tempdir().unwrap().keep();
    let options = format!(
        r#"{{"class": "tandem_envs.reasoning_gym_env:ReasoningGym", "python": {:?},
            "options": {{"tasks": ["leg_counting", "basic_arithmetic"], "size": 200}}}}"#,
        python().display().to_string()
    );
    env_config(&options, &dir, 8)
}

#[test]
#[ignore = "needs the venv of scripts/setup-python.sh (reasoning-gym, math-verify): .ci/run runs it with --ignored"]
fn reasoning_gym_scores_through_the_datasets_own_verifier() {
    assert!(
        imports("reasoning_gym"),
        "run `bash scripts/setup-python.sh` first"
    );
    let env = build_env(&gym());
    let info = env.describe().unwrap();
    assert_eq!(info.splits[0].size, 400);
    assert_eq!(info.splits[1].size, 8);
    let sources: Vec<&str> = info.sources.iter().map(RString::as_str).collect();
    assert_eq!(sources, ["leg_counting", "basic_arithmetic"]);
    let mut samples = Vec::new();
    for (split, i) in [("train", 0), ("train", 1), ("held_out", 0)] {
        let item = env.item(RString::from(split), i).unwrap();
        assert!(item.prompt.contains("<answer>"), "{item:?}");
        for text in [
            format!("so <answer>{}</answer>", item.answer),
            "<answer>x</answer>".into(),
        ] {
            samples.push(ScoreSample {
                item: item.clone(),
                completion: CompletionText {
                    text: text.into(),
                    token_ids: Default::default(),
                    finished: true,
                },
            });
        }
    }
    let out = env.score(samples.into()).unwrap();
    let values: Vec<f32> = out.iter().map(ok).collect();
    assert_eq!(values, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
}

#[test]
#[ignore = "needs the venv of scripts/setup-python.sh (reasoning-gym, math-verify): .ci/run runs it with --ignored"]
fn math_verify_judges_equivalent_answers_equal_in_the_workers_main_thread() {
    assert!(
        imports("math_verify"),
        "run `bash scripts/setup-python.sh` first"
    );
    let options = PoolOptions {
        python: Some(python()),
        ..PoolOptions::default()
    };
    let dir = tempfile::tempdir().unwrap().keep();
    let r = PythonReward::new(
        "tandem_envs.math_verify_reward:compute_score",
        &options,
        &dir,
        &dir.join("run").display().to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = r.score(&[
        sample("The answer is $\\boxed{\\frac{1}{2}}$.", "0.5"),
        sample("so \\boxed{0.5}", "\\frac{1}{2}"),
        sample("The answer is $\\boxed{3}$.", "0.5"),
        sample("I do not know.", "0.5"),
    ]);
    let values: Vec<f32> = out.iter().map(ok).collect();
    assert_eq!(values, [1.0, 1.0, 0.0, 0.0]);
    assert_eq!(out[3].components[0].name.as_str(), "extracted");
    assert_eq!(
        (out[2].components[0].value, out[3].components[0].value),
        (1.0, 0.0)
    );
}
