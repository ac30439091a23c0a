//! Held-out evaluation end to end: `tandem run` with `[eval]` logs the greedy accuracy before
//! the first step, every `every` steps and after the last (also across `--resume`);
//! `tandem eval --job` on the run's checkpoints (full weights, or a LoRA adapter over the
//! job's model) prints the same accuracy and answers as the run's evaluation of that step; a
//! run trains the same with and without `[eval]`; bad input to `tandem eval` is one line with
//! how to fix it.

#![allow(clippy::unwrap_used)]

use crate::common::rl::*;
use std::path::Path;

const EVAL: &str = "[eval]\nevery = 2\nproblems = 8\n";

/// The task of the first test: 16 problems, of which the 8 held out are 6 distinct (the split
/// refuses a held-out set covering most of the training stream).
const SMALL: &str = "max_operand = 3\nreward = \"partial\"\n";

/// A scratch directory whose `model/` had 100 supervised steps on [`SMALL`]: its greedy
/// answers differ from problem to problem (after 60, on some CPUs' float paths, the tiny
/// model still answered " 4" to everything).
fn warm100() -> Scratch {
    let t = Scratch::new();
    let (init, warm) = (t.dir.join("model"), t.dir.join("model-warm"));
    let out = t.tandem(&[
        "model",
        "sft",
        "--model",
        init.to_str().unwrap(),
        "--out",
        warm.to_str().unwrap(),
        "--steps",
        "100",
        "--task-options",
        "max_operand = 3",
    ]);
    assert!(out.status.success(), "{}", out.stderr_text());
    std::fs::remove_dir_all(&init).unwrap();
    std::fs::rename(&warm, &init).unwrap();
    t
}

/// The `eval_accuracy` of each metrics line that has one, by step.
fn evals(metrics: &[serde_json::Value]) -> Vec<(u64, f64)> {
    metrics
        .iter()
        .filter_map(|m| Some((m["step"].as_u64()?, m["eval_accuracy"].as_f64()?)))
        .collect()
}

/// `tandem eval CHECKPOINT --job JOB --json --show 8`: its accuracy and answers.
fn tandem_eval(t: &Scratch, checkpoint: &Path, job: &Path) -> (f64, serde_json::Value) {
    let out = t.tandem(&[
        "eval",
        checkpoint.to_str().unwrap(),
        "--job",
        job.to_str().unwrap(),
        "--json",
        "--show",
        "8",
    ]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let v: serde_json::Value = serde_json::from_str(out.stdout_text().trim()).unwrap();
    assert_eq!(v["problems"], 8);
    (v["accuracy"].as_f64().unwrap(), v["shown"].clone())
}

#[test]
fn eval_is_logged_every_n_steps_and_reproduced_by_tandem_eval() {
    let t = warm100();
    let job = t.job(&JobOpts {
        steps: 4,
        save_every: 2,
        learning_rate: 3e-3,
        task_options: SMALL.into(),
        extra_sections: EVAL.into(),
        ..JobOpts::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        out.stdout_text().contains("held-out accuracy"),
        "{}",
        out.stdout_text()
    );
    let metrics = t.metrics();
    let steps = steps_of(&metrics);
    assert_eq!(
        steps,
        [0, 1, 2, 3, 4],
        "step 0 holds the evaluation before training"
    );
    assert!(metrics[0].get("reward_mean").is_none(), "{}", metrics[0]);
    let logged = evals(&metrics);
    assert_eq!(
        logged.iter().map(|e| e.0).collect::<Vec<_>>(),
        [0, 2, 4],
        "{metrics:?}"
    );
    for m in &metrics {
        let has = m.get("eval_accuracy").is_some();
        assert_eq!(m.get("eval_problems").is_some(), has);
        if has {
            assert_eq!(m["eval_problems"], 8);
        }
    }
    assert_eq!(positions(&t.events(), 2, "eval").len(), 1);
    assert!(t.dir.join("run/plot.png").is_file());

    // The same set, prompts and batches: `tandem eval` on each checkpoint reproduces its
    // step, answer by answer (`eval.jsonl` holds the run's).
    let run = t.dir.join("run");
    let answers: Vec<serde_json::Value> = std::fs::read_to_string(run.join("eval.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 3);
    let completions: std::collections::HashSet<&str> = answers[0]["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["completion"].as_str().unwrap())
        .collect();
    assert!(
        completions.len() > 1,
        "a model answering one thing checks little: {completions:?}"
    );
    for ((step, accuracy), line) in logged.iter().zip(&answers).skip(1) {
        assert_eq!(line["step"].as_u64(), Some(*step));
        let checkpoint = run.join(format!("checkpoints/step-{step:06}"));
        let (got, shown) = tandem_eval(&t, &checkpoint, &job);
        assert_eq!(got, *accuracy, "step {step}");
        assert_eq!(shown, line["answers"], "step {step}");
    }
    let out = t.tandem(&[
        "eval",
        run.join("checkpoints/step-000004").to_str().unwrap(),
        "--job",
        job.to_str().unwrap(),
    ]);
    let line = out.stdout_text();
    assert!(
        line.starts_with("accuracy ") && line.contains("/8) on the held-out set of arithmetic"),
        "{line}"
    );

    // A LoRA run's checkpoint is an adapter: `tandem eval` applies it to the job's model.
    let lora = t.job(&JobOpts {
        steps: 2,
        learning_rate: 2e-2,
        bridge: "lora".into(),
        extra_trainer: "[trainer.options.lora]\nrank = 8\nalpha = 16\n".into(),
        task_options: SMALL.into(),
        extra_sections: EVAL.into(),
        ..JobOpts::default()
    });
    let lora_run = t.dir.join("run-lora");
    let out = t.run(&lora, &["--output-dir", lora_run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let checkpoint = lora_run.join("checkpoints/step-000002");
    assert!(checkpoint.join("adapter_config.json").is_file());
    let last = std::fs::read_to_string(lora_run.join("eval.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 2);
    let (got, shown) = tandem_eval(&t, &checkpoint, &lora);
    assert_eq!(got, last["accuracy"].as_f64().unwrap());
    assert_eq!(shown, last["answers"]);

    // Stopped after step 2 and resumed to 4: step 0 is not evaluated again, 4 is.
    let resumed = t.dir.join("run-resumed");
    let out = t.run(
        &job,
        &["--steps", "2", "--output-dir", resumed.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", out.stderr_text());
    let out = t.tandem(&["run", "--resume", resumed.to_str().unwrap(), "--steps", "4"]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(resumed.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<u64> = evals(&lines).iter().map(|e| e.0).collect();
    assert_eq!(steps, [0, 2, 4], "{lines:?}");
    assert_eq!(lines.len(), 5);
}

#[test]
fn training_is_the_same_with_and_without_eval() {
    let t = Scratch::warm();
    // A large problem space: no training problem of the run collides with the held-out set,
    // so the two runs see the same problems (a collision would be replaced, by design).
    let task = "max_operand = 999\nreward = \"partial\"\n";
    let section = tandem_plugin_envs::tasks::TaskSpec {
        kind: "arithmetic".into(),
        options: toml::from_str(task).unwrap(),
    };
    let held_out = tandem_plugin_envs::tasks::HeldOut::new(&section, 1, 8).unwrap();
    let stream = tandem_plugin_envs::tasks::TrainStream::new(&section, 1, held_out).unwrap();
    assert_eq!(stream.collisions(64), 0);
    let mut figures = Vec::new();
    for (name, extra) in [("with", EVAL), ("without", "")] {
        let job = t.job(&JobOpts {
            steps: 4,
            learning_rate: 3e-3,
            task_options: task.into(),
            extra_sections: extra.into(),
            ..JobOpts::default()
        });
        let dir = t.dir.join(format!("run-{name}"));
        let out = t.run(&job, &["--output-dir", dir.to_str().unwrap()]);
        assert!(out.status.success(), "{}", out.stderr_text());
        let lines: Vec<Vec<String>> = std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|m| m["step"].as_u64() != Some(0))
            .map(|m| {
                [
                    "reward_mean",
                    "exact_frac",
                    "completion_tokens",
                    "loss",
                    "grad_norm",
                ]
                .iter()
                .map(|k| m[k].to_string())
                .collect()
            })
            .collect();
        assert_eq!(lines.len(), 4);
        figures.push(lines);
    }
    assert_eq!(figures[0], figures[1]);
}

#[test]
fn bad_input_to_tandem_eval_is_one_line() {
    let t = Scratch::new();
    let model = t.dir.join("model");
    let no_tokenizer = t.dir.join("bare");
    std::fs::create_dir(&no_tokenizer).unwrap();
    std::fs::copy(model.join("config.json"), no_tokenizer.join("config.json")).unwrap();
    std::fs::write(t.dir.join("bad.toml"), "[eval]\nevery = -1\n").unwrap();
    let cases: [(Vec<&str>, &str, &str); 5] = [
        (
            vec!["eval", "missing"],
            "missing does not exist",
            "checkpoints/step-N",
        ),
        (
            vec!["eval", no_tokenizer.to_str().unwrap()],
            "has no tokenizer.json",
            "--job",
        ),
        (
            vec!["eval", model.to_str().unwrap(), "--job", "bad.toml"],
            "bad.toml",
            "schema",
        ),
        (
            vec!["eval", model.to_str().unwrap(), "--chat"],
            "has no chat template",
            "chat_template.jinja",
        ),
        (
            vec!["eval", model.to_str().unwrap(), "--task", "chess"],
            "environment `chess`",
            "word_problems",
        ),
    ];
    for (args, what, help) in cases {
        let out = t.tandem(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            out.stderr_text()
        );
        let errors: Vec<String> = out
            .stderr_text()
            .lines()
            .filter(|l| l.starts_with("error:"))
            .map(str::to_owned)
            .collect();
        assert_eq!(errors.len(), 1, "{args:?}: {}", out.stderr_text());
        assert!(errors[0].contains(what), "{args:?}: {}", errors[0]);
        assert!(errors[0].contains(help), "{args:?}: {}", errors[0]);
    }
}
