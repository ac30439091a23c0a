//! `tandem serve` helpers shared by `it::serve` and `real::serve_openai_client`: the shared
//! tiny models, a running server (`Srv`, on `--port 0`, its first stdout line parsed) and
//! `tandem generate` to compare against.

use crate::common;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared tiny model (seed 0) and a second checkpoint of the same shape (seed 1), both
/// with a chat template.
pub fn models() -> &'static (PathBuf, PathBuf) {
    static M: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = common::process_scratch("serve");
        let (a, b) = (dir.join("model"), dir.join("model-v2"));
        for (p, seed) in [(&a, 0), (&b, 1)] {
            common::init_model("tiny", seed, p);
            std::fs::write(p.join("chat_template.jinja"), TEMPLATE).unwrap();
        }
        (a, b)
    })
}

/// The test chat template.
pub const TEMPLATE: &str =
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>";

/// A running `tandem serve`.
pub struct Srv {
    /// The `tandem serve` process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    agent: ureq::Agent,
}

impl Srv {
    /// Serves `models().0` with extra arguments.
    pub fn start(extra: &[&str]) -> Srv {
        Srv::start_model(&models().0, extra)
    }

    /// Serves `model`.
    pub fn start_model(model: &Path, extra: &[&str]) -> Srv {
        let mut child = common::tandem()
            .arg("serve")
            .arg(model)
            .args(["--port", "0", "--engine-option", "max_batch = 8"])
            .args(["--engine-option", "max_seq_len = 256"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("tandem serve: listening on ")
            .unwrap_or_else(|| panic!("first line: {line:?}"))
            .to_owned();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        Srv { child, url, agent }
    }

    /// `POST path` with a raw body and headers → (status, body text).
    pub fn raw(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = self.agent.post(format!("{}{path}", self.url));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req
            .header("content-type", "application/json")
            .send(body.as_bytes())
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().unwrap())
    }

    /// `POST path` with JSON → (status, JSON body; `Value::String` when not JSON).
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (s, text) = self.raw(path, &body.to_string(), &[]);
        (
            s,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `GET path` → (status, JSON or text).
    pub fn get(&self, path: &str) -> (u16, Value) {
        let mut resp = self
            .agent
            .get(format!("{}{path}", self.url))
            .call()
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A streamed POST: the `data:` payloads in order (`[DONE]` included).
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let resp = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let reader = BufReader::new(resp.into_body().into_reader());
        reader
            .lines()
            .map(Result::unwrap)
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
            .collect()
    }

    /// Polls `/v1/loads` until `(running, waiting)` is reached (the server's own state).
    pub fn wait_loads(&self, running: u64, waiting: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, v) = self.get("/v1/loads?include=core");
            let l = &v["loads"][0];
            if l["num_running_reqs"] == running && l["num_waiting_reqs"] == waiting {
                return;
            }
            assert!(Instant::now() < deadline, "loads stuck at {l}");
            std::thread::yield_now();
        }
    }
}

impl Drop for Srv {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// `tandem generate --json` on `model` (greedy, with `--score`).
pub fn tandem_generate(model: &Path, prompt: &[u32], max_tokens: u32) -> Value {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let o = common::run(
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["generate", "--json", "--greedy", "--score", "--model"])
            .arg(model)
            .args(["--prompt-ids", &ids.join(","), "--max-tokens"])
            .arg(max_tokens.to_string()),
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A greedy `/generate` body over token ids.
pub fn greedy(ids: &[u32], max_new: u32) -> Value {
    json!({"input_ids": ids, "return_logprob": true,
           "sampling_params": {"temperature": 0, "max_new_tokens": max_new}})
}

/// A JSON list of numbers as f32 (the engine's logprobs are f32; the server writes them as
/// JSON numbers of the same value).
pub fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The logprobs of SGLang `output_token_logprobs` triples.
pub fn triple_lps(v: &Value) -> Vec<f32> {
    f32s(&Value::Array(
        v.as_array().unwrap().iter().map(|t| t[0].clone()).collect(),
    ))
}

/// Equal within `tol` (another batch shape sums in another order).
pub fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

/// The prompt every test uses.
pub const PROMPT: [u32; 5] = [1, 17, 42, 99, 7];
