//! A Python reward as a `dataset` reward spec (`{ python = "module:function", ... }`,
//! `tandem_plugin_envs::python::scorer`): the row's columns reach the function (TRL's keyword
//! arguments, verl's `extra_info`), the pool's options sit beside `python`, and a spec without
//! `python` is left to the built-in verifiers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use common::{REWARDS, ok, python, sample, write_module};
use serde_json::json;
use tandem_plugin_api::EnvironmentConfig;
use tandem_plugin_envs::python::scorer;
use tandem_plugin_envs::verify::ScoreInput;

const ROW_REWARDS: &str = r#"
def by_column(prompts, completions, level, **kwargs):
    assert "prompt" not in kwargs, "the prompt column is `prompts`"
    return [float(c == "x") * l for c, l in zip(completions, level)]

def extra(data_source, solution_str, ground_truth, extra_info=None):
    return extra_info["weight"]
"#;

fn config(run: bool) -> EnvironmentConfig {
    let dir = tempfile::tempdir().unwrap().keep();
    write_module(&dir, "rewards", REWARDS);
    write_module(&dir, "rows", ROW_REWARDS);
    EnvironmentConfig {
        component: "dataset".into(),
        options_json: "{}".into(),
        seed: 0,
        held_out: 0,
        base_dir: dir.display().to_string().into(),
        run_dir: if run {
            dir.join("run").display().to_string().into()
        } else {
            "".into()
        },
    }
}

#[test]
fn the_rows_columns_reach_the_function() {
    let interpreter = python().display().to_string();
    let spec = json!({"python": "rows:by_column", "workers": 1, "interpreter": interpreter,
                      "reward_range": [0, 4]});
    let s = scorer::build(&spec, "reward", &config(true))
        .unwrap()
        .expect("a Python spec");
    assert_eq!(s.range(), (0.0, 4.0));
    let (a, b) = (sample("x", "1"), sample("y", "1"));
    let row = json!({"prompt": "q", "level": 3});
    let inputs = [
        ScoreInput {
            sample: &a,
            row: Some(&row),
        },
        ScoreInput {
            sample: &b,
            row: Some(&row),
        },
    ];
    let out = s.score(&inputs);
    assert_eq!((ok(&out[0]), ok(&out[1])), (3.0, 0.0));
    let spec = json!({"python": "rows:extra", "workers": 1, "interpreter": interpreter});
    let s = scorer::build(&spec, "reward", &config(true))
        .unwrap()
        .unwrap();
    let row = json!({"extra_info": {"weight": 0.5}});
    let out = s.score(&[ScoreInput {
        sample: &a,
        row: Some(&row),
    }]);
    assert_eq!(ok(&out[0]), 0.5);
}

#[test]
fn a_spec_without_python_is_not_ours_and_bad_keys_are_refused() {
    let c = config(false);
    assert!(
        scorer::build(&json!({"verifier": "math"}), "reward", &c)
            .unwrap()
            .is_none()
    );
    let checked = scorer::build(&json!({"python": "rewards:controlled"}), "reward", &c);
    assert!(checked.is_ok(), "only checked: nothing imported");
    let e = scorer::build(
        &json!({"python": "m:f", "verifier": "math"}),
        "sources.gsm8k",
        &c,
    )
    .err()
    .unwrap();
    assert!(e.message.contains("sources.gsm8k.verifier"), "{e}");
    let e = scorer::build(&json!({"python": 3}), "reward", &c)
        .err()
        .unwrap();
    assert!(e.message.contains("reward.python"), "{e}");
    let e = scorer::build(&json!({"python": "nocolon"}), "reward", &c)
        .err()
        .unwrap();
    assert!(e.message.contains("module:name"), "{e}");
}

/// verl's format: chat prompts, `reward_model.ground_truth`, `data_source`, `extra_info`.
const VERL_ROWS: &str = r#"{"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "reward_model": {"ground_truth": "5"}, "data_source": "gsm", "extra_info": {"index": 0}}
{"prompt": [{"role": "user", "content": "What is 1/2 + 1/4?"}], "reward_model": {"ground_truth": "\\frac{3}{4}"}, "data_source": "math", "extra_info": {"index": 1}}
{"prompt": [{"role": "user", "content": "What is 4 + 4?"}], "reward_model": {"ground_truth": "8"}, "data_source": "gsm", "extra_info": {"index": 2}}
{"prompt": [{"role": "user", "content": "What is 3/6?"}], "reward_model": {"ground_truth": "0.5"}, "data_source": "math", "extra_info": {"index": 3}}
"#;

const VERL_REWARD: &str = r#"
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert isinstance(extra_info["index"], int)
    return float(solution_str.strip() == ground_truth)
"#;

/// The `dataset` environment over [`VERL_ROWS`] with `options` (JSON fields after `path`).
fn verl_dataset(options: &str) -> tandem_conformance::EnvironmentSetup {
    let dir = tempfile::tempdir().unwrap().keep();
    std::fs::write(dir.join("rows.jsonl"), VERL_ROWS).unwrap();
    write_module(&dir, "verl_reward", VERL_REWARD);
    let options = format!(r#"{{"path": "rows.jsonl", "shuffle": false, {options}}}"#);
    tandem_conformance::EnvironmentSetup::new(
        tandem_conformance::Source::Module(tandem_plugin_api::sdk::module_of::<
            tandem_plugin_envs::EnvsPlugin,
        >()),
        "dataset",
    )
    .options(&options)
    .base_dir(dir)
    .probe(4) // one epoch: ids repeat in the next
}

/// The answer of every training item, scored: item `i`'s answer and a wrong one.
fn score_answers(setup: &tandem_conformance::EnvironmentSetup) -> Vec<tandem_plugin_api::Reward> {
    let env = setup.build().unwrap();
    let mut samples = Vec::new();
    for i in 0..4 {
        let item = env.item("train".into(), i).unwrap();
        for text in [item.answer.to_string(), "nope".to_string()] {
            let mut s = sample(&text, "");
            s.item = item.clone();
            samples.push(s);
        }
    }
    env.score(samples.into()).unwrap().into_iter().collect()
}

#[test]
fn a_verl_parquet_style_dataset_runs_with_a_verl_reward_unchanged() {
    let interpreter = python().display().to_string();
    let setup = verl_dataset(&format!(
        r#""reward": {{"python": "verl_reward:compute_score", "interpreter": {interpreter:?}}}"#
    ));
    let values: Vec<f32> = score_answers(&setup).iter().map(ok).collect();
    assert_eq!(values, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
    let failures = tandem_conformance::environment_failures(&setup);
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
#[ignore = "needs the venv of scripts/setup-python.sh (reasoning-gym, math-verify): .ci/run runs it with --ignored"]
fn rows_are_routed_by_data_source_to_a_python_reward_or_a_verifier() {
    assert!(
        common::imports("math_verify"),
        "run `bash scripts/setup-python.sh` first"
    );
    let interpreter = python().display().to_string();
    let setup = verl_dataset(&format!(
        r#""sources": {{"math": {{"python": "tandem_envs.math_verify_reward:compute_score",
                                  "interpreter": {interpreter:?}, "workers": 1}},
                       "gsm": {{"verifier": "exact"}}}}"#
    ));
    let out = score_answers(&setup);
    let values: Vec<f32> = out.iter().map(ok).collect();
    assert_eq!(values, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
}
