//! OpenAI's `/v1/models`, `/v1/completions` and `/v1/chat/completions` as SGLang serves them
//! (its extensions `top_k`, `stop_token_ids`, `ignore_eos`, `lora_path`, `return_token_ids`
//! included). `model` naming a loaded adapter generates with it. Logprobs:
//! completions `logprobs: k` → `{tokens, token_logprobs, top_logprobs, text_offset}`, chat
//! `logprobs: true` → `content[{token, logprob, bytes, top_logprobs}]`; each `top_logprobs`
//! entry lists only the sampled token (the engine reports no alternatives).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value, json};
use tandem_model::chat::Message;
use tokio::sync::mpsc::UnboundedReceiver;

use super::native::collect;
use super::openai_stream::stream_openai;
use super::params::{self, ParamError, Params};
use super::{Early, Shared, now, openai_error, reply};
use crate::sched::{Event, Finish, Job};

/// Which route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/completions`.
    Completion,
    /// `/v1/chat/completions`.
    Chat,
}

/// A parsed request.
pub struct Prepared {
    /// Response id.
    pub id: String,
    /// `model` as asked (else the served name).
    pub model: String,
    /// Sampling.
    pub params: Params,
    /// Top-logprob count when logprobs were asked.
    pub logprobs: Option<u32>,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    return_ids: bool,
    return_prompt_ids: bool,
}

/// One choice in flight.
pub struct Choice {
    /// Its events.
    pub rx: UnboundedReceiver<Event>,
    /// Prompt length.
    pub prompt_len: usize,
    prompt: Vec<u32>,
    /// Echoed prompt text (completions with `echo`).
    pub echo: String,
}

fn bad(m: impl Into<String>) -> Response {
    openai_error(StatusCode::BAD_REQUEST, m)
}

fn early(m: impl Into<String>) -> Early {
    Box::new(bad(m))
}

/// `"stop"`, `"length"` or `"abort"`.
pub fn finish_name(f: &Finish) -> &'static str {
    match f {
        Finish::Stop(_) => "stop",
        Finish::Length => "length",
        Finish::Abort(_) => "abort",
    }
}

/// `GET /v1/models`: the served model, then one card per loaded adapter.
pub async fn models(State(app): State<Shared>) -> Response {
    let created = app.started as u64;
    let mut data = vec![
        json!({"id": app.model_name, "object": "model", "created": created,
        "owned_by": "sglang", "root": app.model_path, "parent": null,
        "max_model_len": app.context_len}),
    ];
    for (name, dir) in app.server.lock().adapters.iter() {
        data.push(json!({"id": name, "object": "model", "created": created,
            "owned_by": "sglang", "root": dir, "parent": app.model_name,
            "max_model_len": app.context_len}));
    }
    reply(StatusCode::OK, json!({"object": "list", "data": data}))
}

/// The SGLang sampling keys of an OpenAI body.
fn sampling(body: &Map<String, Value>, kind: Kind) -> Result<Params, ParamError> {
    let mut s = Map::new();
    let max = match kind {
        Kind::Chat => body
            .get("max_completion_tokens")
            .filter(|v| !v.is_null())
            .or_else(|| body.get("max_tokens")),
        Kind::Completion => body.get("max_tokens"),
    };
    let max = max.filter(|v| !v.is_null()).cloned();
    s.insert("max_new_tokens".into(), max.unwrap_or(json!(16)));
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("n", "n"),
        ("stop", "stop"),
        ("stop_token_ids", "stop_token_ids"),
        ("ignore_eos", "ignore_eos"),
        ("seed", "sampling_seed"),
        ("skip_special_tokens", "skip_special_tokens"),
        ("frequency_penalty", "frequency_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("repetition_penalty", "repetition_penalty"),
        ("min_p", "min_p"),
        ("min_tokens", "min_new_tokens"),
        ("logit_bias", "logit_bias"),
        ("regex", "regex"),
        ("json_schema", "json_schema"),
        ("ebnf", "ebnf"),
        ("stream_interval", "stream_interval"),
    ] {
        if let Some(v) = body.get(from) {
            s.insert(to.into(), v.clone());
        }
    }
    params::sglang(&Value::Object(s))
}

fn message(v: &Value) -> Result<Message, String> {
    let role = v
        .get("role")
        .and_then(Value::as_str)
        .ok_or("each message needs a `role` string")?;
    let content = match v.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("text") => Ok(p.get("text").and_then(Value::as_str).unwrap_or_default()),
                other => Err(format!("content part type {other:?} is not supported")),
            })
            .collect::<Result<Vec<_>, _>>()?
            .concat(),
        Some(v) => return Err(format!("message content: expected text, got {v}")),
    };
    Ok(Message::new(role, &content))
}

fn prompts(app: &Shared, body: &Map<String, Value>, kind: Kind) -> Result<Vec<Vec<u32>>, String> {
    if kind == Kind::Chat {
        let msgs = body
            .get("messages")
            .and_then(Value::as_array)
            .ok_or("`messages` must be a list")?;
        let msgs: Vec<Message> = msgs.iter().map(message).collect::<Result<_, _>>()?;
        return Ok(vec![app.text.chat(&msgs)?]);
    }
    let ids = |v: &Value| params::ids("prompt", v).map_err(|_| format!("bad prompt: {v}"));
    match body.get("prompt") {
        Some(Value::String(s)) => Ok(vec![app.text.encode(s, true)?]),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) && !a.is_empty() => a
            .iter()
            .map(|s| app.text.encode(s.as_str().unwrap_or_default(), true))
            .collect(),
        Some(Value::Array(a)) if a.first().is_some_and(Value::is_array) => {
            a.iter().map(ids).collect()
        }
        Some(v @ Value::Array(_)) => Ok(vec![ids(v)?]),
        _ => Err("`prompt` must be a string, a list of strings, or token ids".into()),
    }
}

fn prepare(
    app: &Shared,
    body: &Bytes,
    kind: Kind,
) -> Result<(Prepared, Vec<Choice>, Vec<Job>), Early> {
    let body: Value =
        serde_json::from_slice(body).map_err(|e| early(format!("invalid JSON: {e}")))?;
    let Value::Object(body) = body else {
        return Err(early("the request body must be a JSON object"));
    };
    let mut params = sampling(&body, kind).map_err(|e| match e {
        ParamError::Contract(m) | ParamError::Unsupported(m) => early(m),
    })?;
    let prompts = prompts(app, &body, kind).map_err(bad)?;
    let given = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    let chat_default =
        kind == Kind::Chat && !given("max_tokens") && !given("max_completion_tokens");
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&app.model_name);
    let adapters = app.server.lock().adapters.clone();
    let adapter = match body.get("lora_path").and_then(Value::as_str) {
        Some(a) if adapters.contains_key(a) => Some(a.to_owned()),
        Some(a) => {
            return Err(early(format!(
                "lora_path `{a}`: no adapter of that name is loaded"
            )));
        }
        None => adapters.contains_key(model).then(|| model.to_owned()),
    };
    let flag = |k: &str| body.get(k).and_then(Value::as_bool) == Some(true);
    let logprobs = match kind {
        Kind::Completion => match body.get("logprobs") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .ok_or_else(|| early("`logprobs` must be an integer"))? as u32,
            ),
        },
        Kind::Chat => flag("logprobs").then(|| {
            body.get("top_logprobs")
                .and_then(Value::as_u64)
                .unwrap_or(0) as u32
        }),
    };
    let echo = kind == Kind::Completion && flag("echo");
    if echo && logprobs.is_some() {
        return Err(early("echo with logprobs is not supported by tandem serve"));
    }
    let stream = flag("stream");
    let id = format!(
        "{}-{:016x}",
        if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        now().to_bits()
    );
    let group = now().to_bits();
    let mut choices = Vec::new();
    let mut jobs = Vec::new();
    for (i, prompt) in prompts.into_iter().enumerate() {
        app.text.check(&prompt, app.context_len).map_err(bad)?;
        let room = app.context_len.saturating_sub(prompt.len()) as u32;
        if chat_default {
            // Chat's default budget: what is left of the context.
            params.max_new = room;
        }
        let sampling = params.sampling(&app.text.eos, adapter.clone(), group ^ i as u64);
        let chunk = stream.then(|| params.stream_interval.unwrap_or(8));
        let echo = if echo {
            app.text.decode(&prompt, params.skip_special)
        } else {
            String::new()
        };
        for _ in 0..params.n {
            let (job, rx) = Job::new(
                format!("{id}-{i}"),
                prompt.clone(),
                sampling.clone(),
                params.max_new,
                chunk,
            );
            jobs.push(job);
            choices.push(Choice {
                rx,
                prompt_len: prompt.len(),
                prompt: prompt.clone(),
                echo: echo.clone(),
            });
        }
    }
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    let prep = Prepared {
        id,
        model: model.to_owned(),
        params,
        logprobs,
        include_usage,
        return_ids: flag("return_token_ids"),
        return_prompt_ids: flag("return_prompt_token_ids"),
    };
    Ok((prep, choices, jobs))
}

/// Completions' `logprobs` object; `offset` is where the first token's text starts.
pub fn completion_logprobs(
    app: &Shared,
    tokens: &[u32],
    lps: &[f32],
    top: u32,
    offset: usize,
) -> Value {
    let names: Vec<String> = tokens.iter().map(|&t| app.text.token(t)).collect();
    let mut at = offset;
    let offsets: Vec<usize> = names
        .iter()
        .map(|n| {
            let o = at;
            at += n.len();
            o
        })
        .collect();
    let tops: Vec<Value> = names
        .iter()
        .zip(lps)
        .map(|(n, lp)| {
            if top > 0 {
                json!({ n.as_str(): lp })
            } else {
                Value::Null
            }
        })
        .collect();
    json!({"tokens": names, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// Chat's `logprobs` object.
pub fn chat_logprobs(app: &Shared, tokens: &[u32], lps: &[f32], top: u32) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .zip(lps)
        .map(|(&t, lp)| {
            let name = app.text.token(t);
            let bytes: Vec<u8> = name.as_bytes().to_vec();
            let tops = if top > 0 {
                json!([{"token": name, "logprob": lp, "bytes": bytes}])
            } else {
                json!([])
            };
            json!({"token": name, "logprob": lp, "bytes": bytes, "top_logprobs": tops})
        })
        .collect();
    json!({"content": content})
}

async fn handle(app: Shared, body: Bytes, kind: Kind) -> Response {
    let (prep, choices, jobs) = match prepare(&app, &body, kind) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    app.server.submit(jobs);
    if body_stream(&body) {
        return stream_openai(app, prep, kind, choices);
    }
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    let mut out = Vec::new();
    for (index, mut c) in choices.into_iter().enumerate() {
        let d = match collect(&mut c.rx).await {
            Ok(d) => d,
            Err(e) => return openai_error(StatusCode::BAD_REQUEST, e),
        };
        prompt_tokens += c.prompt_len;
        completion_tokens += d.tokens.len();
        let text = app.text.decode(&d.tokens, prep.params.skip_special);
        let matched = match d.finish {
            Finish::Stop(id) => json!(id),
            _ => Value::Null,
        };
        let mut choice = match kind {
            Kind::Completion => json!({"index": index, "text": format!("{}{text}", c.echo),
                "logprobs": prep.logprobs.map(|k| completion_logprobs(&app, &d.tokens, &d.logprobs, k, c.echo.len())),
                "finish_reason": finish_name(&d.finish), "matched_stop": matched}),
            Kind::Chat => json!({"index": index,
                "message": {"role": "assistant", "content": text, "reasoning_content": null,
                            "tool_calls": null},
                "logprobs": prep.logprobs.map(|k| chat_logprobs(&app, &d.tokens, &d.logprobs, k)),
                "finish_reason": finish_name(&d.finish), "matched_stop": matched}),
        };
        if prep.return_ids {
            let key = if kind == Kind::Chat {
                "response_token_ids"
            } else {
                "token_ids"
            };
            choice[key] = json!(d.tokens);
        }
        if prep.return_prompt_ids || (prep.return_ids && kind == Kind::Completion) {
            choice["prompt_token_ids"] = json!(c.prompt);
        }
        out.push(choice);
    }
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion",
    };
    reply(
        StatusCode::OK,
        json!({"id": prep.id, "object": object, "created": now() as u64,
        "model": prep.model, "choices": out,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens}}),
    )
}

fn body_stream(body: &Bytes) -> bool {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("stream").and_then(Value::as_bool))
        == Some(true)
}

/// `POST /v1/completions`.
pub async fn completions(State(app): State<Shared>, body: Bytes) -> Response {
    handle(app, body, Kind::Completion).await
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(app): State<Shared>, body: Bytes) -> Response {
    handle(app, body, Kind::Chat).await
}
