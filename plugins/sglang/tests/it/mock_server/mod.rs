//! The `sglang` engine (`libtandem_sglang.so`, loaded as the host loads it) attached to a
//! scripted stand-in for an SGLang server on a free loopback port: which routes each ABI call
//! sends and in which order, the lifecycle checked before any route is called, versions and
//! digests read back, and the one-line errors of a server that answers 400, an unknown shape,
//! nothing in time, or dies mid-generation. Needs `cargo build -p tandem-plugin-sglang`.

mod attach;
mod updates;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tandem_conformance::{EngineHarness, EngineSetup, Source};
use tandem_plugin_api::{
    ErrorCode, PResult, PauseMode, PluginError, RResult, RString, RVec, UpdatePayload, WeightUpdate,
};

/// What the stand-in does with one request.
enum Reply {
    Json(u16, Value),
    Text(u16, &'static str),
    /// Answers after this long.
    Late(Duration, Value),
    /// Closes the connection without an answer (a server dying mid-request).
    Hangup,
}

type Handler = Box<dyn FnMut(&str, &str, &Value) -> Option<Reply> + Send>;

/// A scripted server; `seen` records `(method, path, body)` of every request.
struct Mock {
    url: String,
    seen: Arc<Mutex<Vec<(String, String, Value)>>>,
}

fn read_request(s: &mut TcpStream) -> Option<(String, String, Value)> {
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut len = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((
        method,
        path,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    ))
}

fn answer(s: &mut TcpStream, code: u16, body: &str, json: bool) {
    let kind = if json {
        "application/json"
    } else {
        "text/plain"
    };
    let _ = write!(
        s,
        "HTTP/1.1 {code} X\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

impl Mock {
    /// A server at `version` whose `handler` answers first; the routes it leaves (`None`)
    /// get SGLang's success answers, `/update_weights_from_disk` moving the version.
    fn start(mut handler: Handler) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let url = format!(
            "http://{}",
            listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default()
        );
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut version = String::from("0");
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let Some((method, path, body)) = read_request(&mut s) else {
                    continue;
                };
                if let Ok(mut l) = log.lock() {
                    l.push((method.clone(), path.clone(), body.clone()));
                }
                if path == "/update_weights_from_disk" || path == "/update_weight_version" {
                    let key = if path == "/update_weight_version" {
                        "new_version"
                    } else {
                        "weight_version"
                    };
                    version = body[key].as_str().unwrap_or("?").to_owned();
                }
                let reply = handler(&method, &path, &body).unwrap_or_else(|| match path.as_str() {
                    "/health_generate" => Reply::Text(200, ""),
                    "/flush_cache" => Reply::Text(200, "Cache flushed.\n"),
                    "/model_info" => Reply::Json(
                        200,
                        json!({"model_path": "/nonexistent", "weight_version": version}),
                    ),
                    "/server_info" => Reply::Json(
                        200,
                        json!({"enable_memory_saver": true, "enable_lora": true}),
                    ),
                    "/release_memory_occupation" | "/resume_memory_occupation" => {
                        Reply::Json(200, Value::Null)
                    }
                    "/pause_generation" | "/continue_generation" => {
                        Reply::Json(200, json!({"message": "ok", "status": "ok"}))
                    }
                    _ => Reply::Json(
                        200,
                        json!({"success": true, "message": "", "num_paused_requests": 0}),
                    ),
                });
                match reply {
                    Reply::Json(code, v) => answer(&mut s, code, &v.to_string(), true),
                    Reply::Text(code, t) => answer(&mut s, code, t, false),
                    Reply::Late(d, v) => {
                        std::thread::spawn(move || {
                            std::thread::sleep(d);
                            answer(&mut s, 200, &v.to_string(), true);
                        });
                    }
                    Reply::Hangup => drop(s),
                }
            }
        });
        Mock { url, seen }
    }

    /// The paths requested so far (health and info probes left out), then forgets them.
    fn take(&self) -> Vec<(String, Value)> {
        let mut l = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        l.drain(..)
            .filter(|(_, p, _)| {
                !matches!(
                    p.as_str(),
                    "/health_generate" | "/model_info" | "/server_info"
                )
            })
            .map(|(_, p, b)| (p, b))
            .collect()
    }
}

fn setup(mock: &Mock, extra: &str) -> EngineSetup {
    let options = format!(
        r#"{{"url": "{}", "enable_memory_saver": true, "enable_lora": true, "flush_retries": 2,
            "request_timeout_s": 2, "control_timeout_s": 5 {extra}}}"#,
        mock.url
    );
    EngineSetup::new(Source::built("tandem_sglang"), "sglang", "/nonexistent").options(&options)
}

fn engine(mock: &Mock, extra: &str) -> EngineHarness {
    EngineHarness::new(setup(mock, extra)).unwrap_or_else(|f| panic!("{f}"))
}

fn ok<T>(r: PResult<T>) -> T {
    match r {
        RResult::ROk(v) => v,
        RResult::RErr(e) => panic!("{e}"),
    }
}

fn err<T: std::fmt::Debug>(r: PResult<T>) -> PluginError {
    match r {
        RResult::ROk(v) => panic!("accepted: {v:?}"),
        RResult::RErr(e) => e,
    }
}

fn tags(t: &[&str]) -> RVec<RString> {
    t.iter().map(|s| RString::from(*s)).collect()
}

/// SGLang's answer to the harness's two greedy prompts.
fn generation() -> Value {
    let one = json!({"text": "", "output_ids": [7], "meta_info": {
        "finish_reason": {"type": "length", "length": 1},
        "output_token_logprobs": [[-0.5, 7, null]], "weight_version": "0"}});
    json!([one, one])
}

/// The calls the stand-in saw, as `(path, body)`.
fn calls(mock: &Mock) -> Vec<(String, Value)> {
    mock.take()
}

fn want(list: &[(&str, Value)]) -> Vec<(String, Value)> {
    list.iter()
        .map(|(p, b)| ((*p).to_owned(), b.clone()))
        .collect()
}

#[test]
fn lifecycle_calls_map_onto_sglang_routes_in_order() {
    let flushes = Arc::new(Mutex::new(0));
    let f = Arc::clone(&flushes);
    let mock = Mock::start(Box::new(move |_, path, _| {
        // Refused once while "requests still run", then flushed.
        if path == "/flush_cache" {
            let mut n = f.lock().ok()?;
            *n += 1;
            return (*n == 1).then_some(Reply::Text(400, "Cache not flushed: running requests"));
        }
        None
    }));
    let h = engine(&mock, "");
    let e = &h.engine;
    // Flush while serving is the machine's refusal: it never reaches the server.
    assert_eq!(err(e.flush_cache()).code, ErrorCode::InvalidState);
    assert!(mock.take().is_empty());
    ok(e.pause_generation(PauseMode::Keep));
    ok(e.flush_cache());
    ok(e.release_memory(tags(&["weights", "kv_cache"])));
    ok(e.resume_memory(tags(&["kv_cache", "weights"])));
    ok(e.continue_generation());
    ok(e.pause_generation(PauseMode::Abort));
    ok(e.continue_generation());
    ok(e.pause_generation(PauseMode::Wait));
    ok(e.continue_generation());
    assert_eq!(
        calls(&mock),
        want(&[
            ("/pause_generation", json!({"mode": "retract"})),
            ("/flush_cache", Value::Null),
            ("/flush_cache", Value::Null),
            (
                "/release_memory_occupation",
                json!({"tags": ["weights", "kv_cache", "cuda_graph"]})
            ),
            ("/resume_memory_occupation", json!({"tags": ["weights"]})),
            (
                "/resume_memory_occupation",
                json!({"tags": ["kv_cache", "cuda_graph"]})
            ),
            ("/continue_generation", json!({})),
            ("/pause_generation", json!({"mode": "abort"})),
            ("/continue_generation", json!({})),
            ("/pause_generation", json!({"mode": "in_place"})),
            ("/continue_generation", json!({})),
        ])
    );
    // Undeclared tags are refused before the server is asked.
    ok(e.pause_generation(PauseMode::Abort));
    assert_eq!(
        err(e.release_memory(tags(&["optimizer"]))).code,
        ErrorCode::NotSupported
    );
    ok(e.continue_generation());
}

#[test]
fn a_flush_refused_past_its_retries_is_one_line_and_keeps_the_engine_paused() {
    let mock = Mock::start(Box::new(|_, path, _| {
        (path == "/flush_cache").then_some(Reply::Text(400, "requests are running"))
    }));
    let h = engine(&mock, r#", "keep_mode": "in_place""#);
    ok(h.engine.pause_generation(PauseMode::Keep));
    let e = err(h.engine.flush_cache());
    assert_eq!(e.code, ErrorCode::InvalidState);
    assert!(
        e.message
            .contains("GET /flush_cache refused 3 times (400: requests are running)"),
        "{e}"
    );
    assert!(!e.message.contains('\n'));
    // Still paused: release works, generation does not.
    ok(h.engine.release_memory(tags(&["kv_cache"])));
    ok(h.engine.resume_memory(tags(&["kv_cache"])));
    ok(h.engine.continue_generation());
}

#[test]
fn generation_sends_sglang_sampling_keys_and_parses_the_batch() {
    let mock = Mock::start(Box::new(|_, path, _| {
        (path == "/generate").then(|| Reply::Json(200, generation()))
    }));
    let h = engine(&mock, "");
    let out = ok(h.engine.generate(h.greedy()));
    assert_eq!(out.completions.len(), 2);
    assert_eq!(out.completions[1].logprobs.as_slice(), &[-0.5]);
    let got = calls(&mock);
    let body = &got[0].1;
    assert_eq!(body["return_logprob"], json!(true));
    assert_eq!(body["sampling_params"]["ignore_eos"], json!(true));
    assert!(body.get("lora_path").is_none());
}

#[test]
fn a_bad_server_is_one_line_and_the_engine_keeps_its_state() {
    let cases: [(&str, Reply, ErrorCode, &str); 4] = [
        (
            "400",
            Reply::Json(400, json!({"error": "unknown field `foo`"})),
            ErrorCode::InvalidInput,
            "POST /generate: server answered 400: unknown field `foo`",
        ),
        (
            "shape",
            Reply::Json(200, json!({"text": "x"})),
            ErrorCode::Runtime,
            "POST /generate: unexpected answer: not a list",
        ),
        (
            "late",
            Reply::Late(Duration::from_secs(4), generation()),
            ErrorCode::Timeout,
            "POST /generate: no answer within 2 s",
        ),
        (
            "dead",
            Reply::Hangup,
            ErrorCode::Unavailable,
            "POST /generate: cannot reach the server",
        ),
    ];
    for (name, reply, code, text) in cases {
        let mut reply = Some(reply);
        let mock = Mock::start(Box::new(move |_, path, _| {
            if path == "/generate" {
                reply.take()
            } else {
                None
            }
        }));
        let h = engine(&mock, "");
        let e = err(h.engine.generate(h.greedy()));
        assert_eq!(e.code, code, "{name}: {e}");
        assert!(
            e.message.contains(text) && !e.message.contains('\n'),
            "{name}: {e}"
        );
        assert!(!e.help.is_empty(), "{name}: no help");
        assert!(
            ok(h.engine.health()).ready,
            "{name}: the engine left serving"
        );
    }
}

#[test]
fn an_attached_server_must_have_the_declared_features_and_traces_every_exchange() {
    let mock = Mock::start(Box::new(|_, path, _| {
        (path == "/server_info").then(|| Reply::Json(200, json!({"enable_memory_saver": false})))
    }));
    let setup = EngineSetup::new(Source::built("tandem_sglang"), "sglang", "/nonexistent").options(
        &format!(r#"{{"url": "{}", "enable_memory_saver": true}}"#, mock.url),
    );
    let f = match EngineHarness::new(setup) {
        Ok(_) => panic!("attached to a server without the memory saver"),
        Err(f) => f.to_string(),
    };
    assert!(f.contains("started without --enable-memory-saver"), "{f}");

    let dir = tempfile_dir();
    let trace = dir.join("trace.jsonl");
    let mock = Mock::start(Box::new(|_, _, _| None));
    let h = engine(
        &mock,
        &format!(r#", "trace_requests": "{}""#, trace.display()),
    );
    ok(h.engine.pause_generation(PauseMode::Abort));
    ok(h.engine.continue_generation());
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let pause = lines
        .iter()
        .find(|l| l["path"] == "/pause_generation")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(pause["method"], "POST");
    assert_eq!(pause["status"], 200);
    assert_eq!(pause["request"], json!({"mode": "abort"}));
    assert_eq!(pause["response"]["status"], "ok");
    assert!(lines.iter().all(|l| l.get("query").is_some()));
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-sglang-mock-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}
