//! The real `openai` Python client (PyPI, pinned in `python/requirements-cpu.lock`) against
//! `tandem serve`: completion, streamed completion, chat and streamed chat through
//! `python/openai_client_check.py`, each answer's tokens and logprobs equal to
//! `tandem generate --score` on the same prompt tokens. Needs the Python env
//! (`TANDEM_PYTHON`), so it is ignored by default; `.ci/run` runs it:
//!
//! ```text
//! TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1) \
//!   cargo test -p tandem --test real -- --ignored serve_openai_client::
//! ```

use crate::common::{
    self,
    serve::{Srv, f32s, models, tandem_generate},
};
use serde_json::Value;
use std::process::Command;

const MAX_TOKENS: u32 = 6;

/// Tokens and logprobs of one call, checked against the engine on the prompt the server
/// reports (for a streamed chat, which carries no token ids, on the non-streamed chat's).
fn matches_the_engine(what: &str, r: &Value, prompt: &[u32]) {
    let reference = tandem_generate(&models().0, prompt, MAX_TOKENS);
    let n = reference["tokens"].as_array().unwrap().len();
    if !r["token_ids"].is_null() {
        assert_eq!(r["token_ids"], reference["tokens"], "{what}: token ids");
    }
    assert_eq!(r["tokens"].as_array().unwrap().len(), n, "{what}: {r}");
    let got = f32s(&r["logprobs"]);
    let want = f32s(&reference["logprobs"]);
    let score = f32s(&reference["score"]);
    // The score holds the logprob of every token after the first: the completion's are the
    // last n.
    let scored = &score[score.len() - n..];
    for i in 0..n {
        assert!(
            (got[i] - want[i]).abs() <= 1e-5,
            "{what}: logprob {i}: {} vs the engine's {}",
            got[i],
            want[i]
        );
        assert!(
            (got[i] - scored[i]).abs() <= 1e-4,
            "{what}: logprob {i}: {} vs `tandem generate --score` {}",
            got[i],
            scored[i]
        );
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("no token ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
#[ignore = "needs the Python env with `openai`: TANDEM_PYTHON, --ignored"]
fn the_openai_client_completes_streams_and_chats_with_the_engines_logprobs() {
    let python = common::python_env("serve");
    let srv = Srv::start(&[]);
    let script = common::workspace_root().join("python/openai_client_check.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&srv.url)
        .arg("tiny")
        .args(["--prompt", "1+2=", "--max-tokens", &MAX_TOKENS.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai_client_check.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let prompt = ids(&v["completion"]["prompt_token_ids"]);
    for what in ["completion", "completion_stream"] {
        matches_the_engine(what, &v[what], &prompt);
    }
    let chat_prompt = ids(&v["chat"]["prompt_token_ids"]);
    for what in ["chat", "chat_stream"] {
        matches_the_engine(what, &v[what], &chat_prompt);
    }
    assert_eq!(v["chat"]["text"], v["chat_stream"]["text"]);
    assert_eq!(v["completion"]["text"], v["completion_stream"]["text"]);
}
