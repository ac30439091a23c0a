//! Tests of the `[run]`, `[environment]`/`[task]` and `[eval]` checks: each problem is one
//! issue at its key and line. The environments are the built-in ones (`tandem-plugin-envs`,
//! linked into this test binary).

#![allow(clippy::unwrap_used)]

use super::issues::Issues;
use super::{environment, eval, tools};
use crate::config::{ConfigError, ConfigIssue, LoadedJob, validate_task_and_eval};
use std::path::Path;
use tandem_plugin_envs as _;
use tandem_runtime::registry::Registry;

const HEAD: &str = "[model]\npath = \"m\"\n[engine]\nplugin = \"native\"\n[trainer]\nplugin = \"native\"\n[bridge]\nmode = \"ipc\"\n";

fn job(tail: &str) -> LoadedJob {
    LoadedJob::parse(Path::new("job.toml"), format!("{HEAD}{tail}")).unwrap()
}

/// The built-in plugins of this test binary.
fn registry() -> Registry {
    Registry::builtins().unwrap()
}

fn issues(e: ConfigError) -> Vec<ConfigIssue> {
    match e {
        ConfigError::Invalid { issues } => issues,
        other => panic!("{other}"),
    }
}

/// The one issue of `tail`'s `[task]` / `[eval]`: its key, line and text.
fn one(tail: &str) -> (String, usize, String) {
    let found = issues(validate_task_and_eval(&job(tail), &registry()).unwrap_err());
    assert_eq!(found.len(), 1, "{found:?}");
    let i = &found[0];
    (i.key.clone(), i.position.unwrap().0, i.to_string())
}

#[test]
fn eval_and_task_problems_name_their_key() {
    let words = "[task]\nkind = \"word_problems\"\n";
    let (key, line, text) = one(&format!("{words}[eval]\nevery = 5\nproblems = 0\n"));
    assert_eq!((key.as_str(), line), ("eval.problems", 13), "{text}");
    let (key, line, _) = one(&format!("{words}[eval]\nevery = 5\nmax_tokens = 0\n"));
    assert_eq!((key.as_str(), line), ("eval.max_tokens", 13));
    let (key, line, text) = one("[task]\nsystem = \"Be brief.\"\n");
    assert_eq!((key.as_str(), line), ("task.system", 10), "{text}");
    assert!(text.contains("chat = true"), "{text}");
    // 4 distinct problems cannot leave the training stream room for 64 held out.
    let (key, _, text) = one(
        "[task]\nkind = \"arithmetic\"\n[task.options]\nmax_operand = 1\n[eval]\nevery = 1\nproblems = 64\n",
    );
    assert_eq!(key, "eval.problems");
    assert!(text.contains("too few distinct problems"), "{text}");
    // Evaluation off: the split is not checked.
    let off =
        "[task]\nkind = \"arithmetic\"\n[task.options]\nmax_operand = 1\n[eval]\nproblems = 64\n";
    assert!(validate_task_and_eval(&job(off), &registry()).is_ok());
    let ok = "[task]\nkind = \"word_problems\"\nchat = true\n[eval]\nevery = 10\n";
    assert!(validate_task_and_eval(&job(ok), &registry()).is_ok());
    // Unknown keys are refused when the file is parsed.
    let e = LoadedJob::parse(Path::new("job.toml"), format!("{HEAD}[eval]\nevry = 2\n"));
    let text = e.unwrap_err().to_string();
    assert!(text.contains("eval") && text.contains("evry"), "{text}");
}

/// The issues `check_chat` finds for `tail` with the model at `model`.
fn chat_issues(tail: &str, model: &Path) -> Vec<ConfigIssue> {
    let job = job(tail);
    let mut found = Issues::new(&job);
    let env = environment::check(&mut found, &registry(), &job);
    environment::check_chat(&mut found, &job.job, model, env.as_ref());
    eval::check(&mut found, &job.job);
    if found.is_empty() {
        return Vec::new();
    }
    issues(found.into_error())
}

#[test]
fn chat_needs_the_models_template() {
    let chat = "[task]\nkind = \"word_problems\"\nchat = true\n";
    let with = crate::prompt::tests::model_dir(&[crate::prompt::tests::chatml_config()]);
    assert!(chat_issues(chat, with.path()).is_empty());
    let without = crate::prompt::tests::model_dir(&[]);
    let found = chat_issues(chat, without.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].key, "task.chat");
    assert_eq!(found[0].position.unwrap().0, 11);
    let text = found[0].to_string();
    assert!(
        text.contains(&without.path().display().to_string()),
        "{text}"
    );
    assert!(text.contains("no chat template"), "{text}");
    // A preset model (created by the run) has no template.
    let mut job = job(chat);
    job.job.model.init_preset = Some("tiny".into());
    let mut found = Issues::new(&job);
    environment::check_chat(&mut found, &job.job, Path::new("/nonexistent/model"), None);
    let found = issues(found.into_error());
    assert_eq!(found[0].key, "task.chat");
    assert!(found[0].message.contains("preset `tiny`"), "{:?}", found[0]);
    // A template that fails on the task's prompt is reported at the key too.
    let raising = crate::prompt::tests::model_dir(&[(
        "chat_template.jinja",
        serde_json::json!("{{ raise_exception('no user turns here') }}"),
    )]);
    let found = chat_issues(chat, raising.path());
    assert_eq!(found[0].key, "task.chat");
    assert!(
        found[0].message.contains("no user turns here"),
        "{:?}",
        found[0]
    );
}

#[test]
fn the_restart_budget_is_checked_at_its_keys() {
    let found = |tail: &str| {
        let loaded = job(tail);
        let mut found = Issues::new(&loaded);
        super::run::check(&mut found, &loaded.job.run);
        if found.is_empty() {
            Vec::new()
        } else {
            issues(found.into_error())
        }
    };
    let keys = |tail: &str| -> Vec<String> { found(tail).iter().map(|i| i.key.clone()).collect() };
    assert!(found("[run]\nmax_restarts = 2\nrestart_backoff_secs = 0.5\n").is_empty());
    assert_eq!(
        keys("[run]\nrestart_backoff_secs = -1.0\n"),
        ["run.restart_backoff_secs"]
    );
    assert_eq!(
        keys("[run]\nrestart_backoff_secs = nan\n"),
        ["run.restart_backoff_secs"]
    );
    let over = found("[run]\nmax_restarts = 5\nmax_restarts_per_run = 4\n");
    assert_eq!(over.len(), 1, "{over:?}");
    assert_eq!(over[0].key, "run.max_restarts");
    assert!(
        over[0].to_string().contains("max_restarts_per_run"),
        "{}",
        over[0]
    );
}

/// The issues of `tail`'s environment with tools, the model at `model`: the keys.
fn tool_keys(tail: &str, model: &Path) -> Vec<(String, String)> {
    let job = job(tail);
    let mut found = Issues::new(&job);
    let env = environment::check(&mut found, &registry(), &job);
    environment::check_chat(&mut found, &job.job, model, env.as_ref());
    tools::check(&mut found, &job.job);
    if found.is_empty() {
        return Vec::new();
    }
    let list = issues(found.into_error());
    for i in &list {
        assert!(!i.to_string().contains('\n'), "one line: {i}");
    }
    list.into_iter()
        .map(|i| (i.key.clone(), i.to_string()))
        .collect()
}

#[test]
fn tools_are_checked_at_their_keys() {
    let m = crate::prompt::tests::model_dir(&[crate::prompt::tests::chatml_config()]);
    let env = "[environment]\nplugin = \"word_problems\"\nchat = true\n";
    let ok = format!("{env}tools = [\"calculate\"]\ntool_format = \"hermes\"\n");
    assert_eq!(tool_keys(&ok, m.path()), []);
    let key = |tail: &str| -> Vec<String> {
        tool_keys(&format!("{env}{tail}"), m.path())
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let tools = "tools = [\"calculate\"]\ntool_format = \"hermes\"\n";
    assert_eq!(
        key("tools = [\"search\"]\ntool_format = \"hermes\"\n"),
        ["environment.tools"]
    );
    assert_eq!(
        key("tools = [\"calculate\"]\ntool_format = \"mistral\"\n"),
        ["environment.tool_format"]
    );
    assert_eq!(
        key(&format!("{tools}max_turns = 1\n")),
        ["environment.max_turns"]
    );
    assert_eq!(
        key(&format!("{tools}max_trajectory_tokens = 2\n")),
        ["environment.max_trajectory_tokens"]
    );
    assert_eq!(
        key("tool_format = \"hermes\"\n"),
        ["environment.tool_format"]
    );
    assert_eq!(
        key(&format!("{tools}[algorithm]\nloss_agg = \"seq-mean\"\n")),
        ["algorithm.loss_agg"]
    );
    assert_eq!(
        key(&format!("{tools}[algorithm]\nratio = \"sequence\"\n")),
        ["algorithm.ratio"]
    );
    // SmolLM2's ChatML teaches no tool-call format: name one.
    let found = tool_keys(&format!("{env}tools = [\"calculate\"]\n"), m.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "environment.tools");
    assert!(found[0].1.contains("tool-call format"), "{}", found[0].1);
    // Tools without chat prompts.
    let plain = "[environment]\nplugin = \"word_problems\"\ntools = [\"calculate\"]\n";
    let found = tool_keys(plain, m.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].1.contains("chat prompts"), "{}", found[0].1);
    // A template that drops earlier assistant turns is refused with tools, not without.
    let drops = "{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' and not loop.last %}{% set c = '' %}{% endif %}<|im_start|>{{ m['role'] }}\n{{ c }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let d = crate::prompt::tests::model_dir(&[("chat_template.jinja", serde_json::json!(drops))]);
    assert_eq!(tool_keys(env, d.path()), []);
    let found = tool_keys(&ok, d.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "environment.tools");
    assert!(found[0].1.contains("not append-only"), "{}", found[0].1);
}
