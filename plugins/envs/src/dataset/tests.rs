//! Tests of the `dataset` environment on JSONL fixtures: column mapping, options errors,
//! splits, determinism and reward routing.

use super::Dataset;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::Path;
use tandem_plugin_api::sdk::EnvironmentImpl;
use tandem_plugin_api::{
    CompletionText, EnvItem, EnvironmentConfig, RVec, RewardStatus, ScoreSample,
};

/// Writes `rows` as JSONL to `dir/name`.
pub(super) fn write_jsonl(dir: &Path, name: &str, rows: &[Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.join(name), text).expect("write fixture");
}

pub(super) fn config(dir: &Path, options: Value, seed: u64, held_out: u32) -> EnvironmentConfig {
    EnvironmentConfig {
        component: "dataset".into(),
        options_json: options.to_string().into(),
        seed,
        held_out,
        base_dir: dir.to_string_lossy().as_ref().into(),
        run_dir: "".into(),
    }
}

pub(super) fn build(dir: &Path, options: Value) -> Result<Dataset, String> {
    Dataset::new(&config(dir, options, 7, 0)).map_err(|e| e.to_string())
}

fn arith_rows(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({"question": format!("What is {i} + 1?"), "answer": (i + 1).to_string(),
                   "data_source": if i % 2 == 0 { "even" } else { "odd" }, "level": i % 3})
        })
        .collect()
}

fn arith(dir: &Path, n: usize) {
    write_jsonl(dir, "a.jsonl", &arith_rows(n));
}

const MATH: &str = r#"{"verifier": "math"}"#;

fn opts(extra: Value) -> Value {
    let mut o = json!({"path": "a.jsonl", "prompt": "question", "reward": serde_json::from_str::<Value>(MATH).expect("json")});
    if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
        o.extend(extra.clone());
    }
    o
}

#[test]
fn rows_become_items_with_metadata() {
    let dir = tempfile::tempdir().expect("tempdir");
    arith(dir.path(), 4);
    let d = build(dir.path(), opts(json!({"shuffle": false}))).expect("builds");
    let item = d.item("train", 1).expect("item");
    assert_eq!(item.id.as_str(), "1");
    assert_eq!(item.prompt.as_str(), "What is 1 + 1?");
    assert_eq!(item.answer.as_str(), "2");
    assert_eq!(item.source.as_str(), "odd");
    let meta: Value = serde_json::from_str(item.metadata_json.as_str()).expect("json");
    assert_eq!(meta, json!({"level": 1}));
    let info = d.describe().expect("describe");
    assert_eq!(info.splits.len(), 1);
    assert_eq!(info.splits[0].size, 4);
    assert_eq!(
        info.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        ["even", "odd"]
    );
    assert_eq!((info.reward_min, info.reward_max), (0.0, 1.0));
    assert_eq!(
        info.components
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>(),
        ["math"]
    );
}

#[test]
fn chat_messages_and_nested_answers_are_mapped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = [
        json!({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
                       "reward_model": {"ground_truth": "2", "style": "rule"}, "data_source": "s", "extra_info": {"index": 0}}),
    ];
    write_jsonl(dir.path(), "a.jsonl", &rows);
    let d = build(
        dir.path(),
        json!({"path": "a.jsonl", "reward": {"verifier": "exact"}}),
    )
    .expect("builds");
    let item = d.item("train", 0).expect("item");
    assert!(item.prompt.is_empty());
    assert_eq!(item.messages.len(), 2);
    assert_eq!(item.messages[1].content.as_str(), "1+1?");
    assert_eq!(item.answer.as_str(), "2", "reward_model.ground_truth");
    let meta: Value = serde_json::from_str(item.metadata_json.as_str()).expect("json");
    assert_eq!(meta, json!({"extra_info": {"index": 0}}));
}

fn error(dir: &Path, options: Value) -> String {
    match build(dir, options) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn bad_data_gets_one_line_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    arith(d, 3);
    let e = error(d, opts(json!({"path": "missing.jsonl"})));
    assert!(
        e.starts_with("options.path: ")
            && e.contains("missing.jsonl: does not exist")
            && e.contains("help:"),
        "{e}"
    );
    std::fs::write(d.join("empty.jsonl"), "\n\n").expect("write");
    let e = error(d, opts(json!({"path": "empty.jsonl"})));
    assert!(e.contains("has no rows"), "{e}");
    let e = error(d, opts(json!({"prompt": "query"})));
    assert!(
        e.contains("options.prompt: ")
            && e.contains("has no column `query`;")
            && e.contains("answer, data_source, level, question"),
        "{e}"
    );
    let e = error(d, opts(json!({"answer": "solution"})));
    assert!(e.contains("`solution`"), "{e}");
    write_jsonl(
        d,
        "num.jsonl",
        &[
            json!({"prompt": "a", "answer": "1"}),
            json!({"prompt": 5, "answer": "1"}),
        ],
    );
    let e = error(
        d,
        json!({"path": "num.jsonl", "reward": {"verifier": "exact"}}),
    );
    assert!(e.contains("row 1: column `prompt` is a number"), "{e}");
    write_jsonl(d, "noanswer.jsonl", &[json!({"prompt": "a"})]);
    let e = error(
        d,
        json!({"path": "noanswer.jsonl", "reward": {"verifier": "exact"}}),
    );
    assert!(
        e.contains("has no column `answer`, `ground_truth` or `reward_model.ground_truth`"),
        "{e}"
    );
    build(
        d,
        json!({"path": "noanswer.jsonl", "reward": {"verifier": "length", "target": 8}}),
    )
    .expect("a reward without answers needs no answer column");
    let e = error(d, opts(json!({"reward": {"verifier": "nope"}})));
    assert!(
        e.contains("reward") && e.contains("nope") && e.contains("json_schema"),
        "{e}"
    );
    let e = error(d, opts(json!({"shufle": false})));
    assert!(e.contains("shufle"), "{e}");
    let e = error(d, opts(json!({"held_out_fraction": 1.5})));
    assert!(
        e.contains("held_out_fraction: 1.5 is not between 0 and 1"),
        "{e}"
    );
    let e = error(d, opts(json!({"sources": {"evn": {"verifier": "exact"}}})));
    assert!(
        e.contains("sources.evn: no row has this data source") && e.contains("even, odd"),
        "{e}"
    );
    let e = error(d, json!({"path": "a.jsonl", "prompt": "question"}));
    assert!(e.contains("reward: no reward is set"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
}

#[test]
fn items_are_a_pure_function_of_seed_split_and_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    arith(dir.path(), 50);
    let a = build(dir.path(), opts(json!({"held_out_fraction": 0.2}))).expect("builds");
    let b = build(dir.path(), opts(json!({"held_out_fraction": 0.2}))).expect("builds");
    let ids = |d: &Dataset, split: &str, n: u64| -> Vec<EnvItem> {
        (0..n).map(|i| d.item(split, i).expect("item")).collect()
    };
    assert_eq!(ids(&a, "train", 130), ids(&b, "train", 130));
    assert_eq!(ids(&a, "held_out", 10), ids(&b, "held_out", 10));
    // Out of order, across epochs: the same items.
    for i in [129u64, 3, 80, 41, 0] {
        assert_eq!(
            a.item("train", i).expect("item"),
            ids(&b, "train", 130)[i as usize]
        );
    }
    let other = Dataset::new(&config(
        dir.path(),
        opts(json!({"held_out_fraction": 0.2})),
        8,
        0,
    ))
    .map_err(|e| e.to_string())
    .expect("builds");
    assert_ne!(
        ids(&a, "train", 40),
        ids(&other, "train", 40),
        "another seed, another order"
    );
    assert!(a.item("held_out", 10).is_err());
    assert!(a.item("test", 0).is_err());
}

#[test]
fn each_epoch_is_a_permutation_of_the_training_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    arith(dir.path(), 40);
    let d = build(dir.path(), opts(json!({}))).expect("builds");
    let epoch = |e: u64| -> Vec<String> {
        (e * 40..(e + 1) * 40)
            .map(|i| d.item("train", i).expect("item").id.to_string())
            .collect()
    };
    let (e0, e1) = (epoch(0), epoch(1));
    let all: HashSet<String> = (0..40).map(|i| i.to_string()).collect();
    assert_eq!(e0.iter().cloned().collect::<HashSet<_>>(), all);
    assert_eq!(e1.iter().cloned().collect::<HashSet<_>>(), all);
    assert_ne!(e0, e1, "each epoch has its own order");
    assert_ne!(
        e0,
        (0..40).map(|i| i.to_string()).collect::<Vec<_>>(),
        "shuffled"
    );
    let plain = build(dir.path(), opts(json!({"shuffle": false}))).expect("builds");
    let order: Vec<String> = (40..80)
        .map(|i| plain.item("train", i).expect("item").id.to_string())
        .collect();
    assert_eq!(order, (0..40).map(|i| i.to_string()).collect::<Vec<_>>());
}

#[test]
fn held_out_splits_never_share_a_prompt_with_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    arith(d, 30);
    let split = build(d, opts(json!({"held_out_fraction": 0.1}))).expect("builds");
    let info = split.describe().expect("describe");
    assert_eq!((info.splits[0].size, info.splits[1].size), (27, 3));
    let train: HashSet<String> = (0..27)
        .map(|i| split.item("train", i).expect("item").prompt.to_string())
        .collect();
    for i in 0..3 {
        assert!(!train.contains(split.item("held_out", i).expect("item").prompt.as_str()));
    }
    let from_eval = Dataset::new(&config(d, opts(json!({})), 7, 5))
        .map_err(|e| e.to_string())
        .expect("builds");
    assert_eq!(
        from_eval.describe().expect("describe").splits[1].size,
        5,
        "[eval] problems rows held out"
    );
    let e = Dataset::new(&config(d, opts(json!({})), 7, 30))
        .map(|_| ())
        .map_err(|e| e.to_string());
    let e = e.expect_err("all 30 rows held out");
    assert!(
        e.starts_with("held_out: cannot hold out 30 of the data's 30 rows"),
        "{e}"
    );
    write_jsonl(d, "held.jsonl", &arith_rows(40)[35..]);
    let file = build(d, opts(json!({"held_out": "held.jsonl"}))).expect("disjoint file");
    assert_eq!(file.describe().expect("describe").splits[1].size, 5);
    write_jsonl(d, "overlap.jsonl", &arith_rows(40)[28..32]);
    let e = error(d, opts(json!({"held_out": "overlap.jsonl"})));
    assert!(
        e.starts_with("options.held_out: the held-out split overlaps training")
            && e.contains("What is 28 + 1?"),
        "{e}"
    );
    write_jsonl(d, "a.jsonl", &vec![arith_rows(1)[0].clone(); 10]);
    let e = error(d, opts(json!({"held_out_fraction": 0.5})));
    assert!(
        e.contains("overlaps training") && e.contains("duplicate prompts"),
        "{e}"
    );
    let e = error(d, opts(json!({"id": "level"})));
    assert!(e.contains("two rows with id"), "{e}");
}

fn sample(item: EnvItem, text: &str) -> ScoreSample {
    ScoreSample {
        item,
        completion: CompletionText {
            text: text.into(),
            token_ids: RVec::from(vec![1u32, 2]),
            finished: true,
        },
    }
}

#[test]
fn rewards_are_routed_by_data_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    arith(dir.path(), 4);
    let d = build(
        dir.path(),
        json!({"path": "a.jsonl", "prompt": "question", "shuffle": false,
        "sources": {"odd": {"components": [{"verifier": "exact", "weight": 2.0}]}}}),
    )
    .expect("builds");
    let (even, odd) = (
        d.item("train", 0).expect("item"),
        d.item("train", 1).expect("item"),
    );
    let rewards = d
        .score(vec![
            sample(odd.clone(), "2"),
            sample(even, "1"),
            sample(odd, "3"),
        ])
        .expect("scores");
    assert_eq!(rewards[0].status, RewardStatus::Ok);
    assert_eq!(rewards[0].value, 2.0);
    assert_eq!(rewards[1].status, RewardStatus::NotApplicable);
    assert!(
        rewards[1].reason.contains("`even`"),
        "{}",
        rewards[1].reason
    );
    assert_eq!(
        (rewards[2].status, rewards[2].value),
        (RewardStatus::Ok, 0.0)
    );
    let info = d.describe().expect("describe");
    assert_eq!((info.reward_min, info.reward_max), (0.0, 2.0));
    let declared: Vec<&str> = info.components.iter().map(|c| c.as_str()).collect();
    assert_eq!(declared, ["exact"]);
    assert_eq!(rewards[0].components.len(), 1, "one spec: its components");
    let both = build(
        dir.path(),
        opts(json!({"shuffle": false, "sources": {"odd": {"verifier": "exact"}}})),
    )
    .expect("builds");
    let r = both
        .score(vec![sample(
            both.item("train", 0).expect("item"),
            "the answer is 1",
        )])
        .expect("scores");
    assert_eq!(
        (r[0].status, r[0].value),
        (RewardStatus::Ok, 1.0),
        "even rows use `reward` (math)"
    );
    let info = both.describe().expect("describe");
    assert!(info.components.is_empty(), "the specs differ");
    assert!(
        r[0].components.is_empty(),
        "so no reward reports components"
    );
    let row = both
        .row_of(&both.item("train", 2).expect("item"))
        .expect("row");
    assert_eq!(row.get("level"), Some(&json!(2)));
}

#[test]
fn the_shipped_example_scores_its_own_answers_in_full() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/data");
    let options = json!({"path": "arith-mix.jsonl", "id": "id", "held_out_fraction": 0.1, "sources": {
        "arith/int": {"verifier": "last_integer"}, "arith/fraction": {"verifier": "math"},
        "arith/choice": {"verifier": "choice"}}});
    let d = Dataset::new(&config(&data, options, 0, 0))
        .map_err(|e| e.to_string())
        .expect("builds");
    let info = d.describe().expect("describe");
    assert_eq!((info.splits[0].size, info.splits[1].size), (270, 30));
    assert_eq!(info.sources.len(), 3);
    let samples: Vec<ScoreSample> = (0..270)
        .map(|i| {
            let item = d.item("train", i).expect("item");
            let text = match item.source.as_str() {
                "arith/int" => format!("The answer is {}.", item.answer),
                "arith/fraction" => format!("So the result is \\boxed{{{}}}", item.answer),
                _ => format!("Answer: {}", item.answer),
            };
            sample(item, &text)
        })
        .collect();
    for r in d.score(samples).expect("scores") {
        assert_eq!((r.status, r.value), (RewardStatus::Ok, 1.0), "{}", r.reason);
    }
}
