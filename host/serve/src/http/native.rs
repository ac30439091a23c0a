//! SGLang's `/generate`: `text` or `input_ids` (one prompt or a batch), `sampling_params`
//! (one object or one per prompt), `return_logprob` (`meta_info.output_token_logprobs` =
//! `[[logprob, token_id, text|null], ...]`), `top_logprobs_num` (the sampled token only: the
//! engine reports no alternatives), `rid`, `lora_path` (an adapter name), `stream` (SSE,
//! cumulative `text`/`output_ids` per frame, as SGLang streams by default).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use tandem_plugin_api::RVec;
use tokio::sync::mpsc::UnboundedReceiver;

use super::openai_stream::{Sse, sse_response};
use super::params::{self, ParamError, Params};
use super::{Early, Shared, invalid, now, refused, reply};
use crate::sched::{Event, Finish, Job};

/// One sequence of a `/generate` request as submitted.
struct Seq {
    rid: String,
    prompt_len: usize,
    logprob: bool,
    top: bool,
    text_in_lp: bool,
    skip_special: bool,
    /// `logprob_start_len` and the prompt, when input logprobs were asked for.
    input: Option<(usize, Vec<u32>)>,
    rx: UnboundedReceiver<Event>,
}

/// A finished sequence.
pub struct Done {
    /// Tokens.
    pub tokens: Vec<u32>,
    /// Their logprobs.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: Finish,
    /// Engine version that produced it.
    pub version: u64,
}

/// Collects a job's events into its result, or the engine's error.
pub async fn collect(rx: &mut UnboundedReceiver<Event>) -> Result<Done, String> {
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Tokens(t, l) => {
                tokens.extend(t);
                logprobs.extend(l);
            }
            Event::Done(finish, version) => {
                return Ok(Done {
                    tokens,
                    logprobs,
                    finish,
                    version,
                });
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err("the server dropped the request".into())
}

fn many(v: Option<&Value>, i: usize) -> Option<&Value> {
    match v? {
        Value::Array(a) => a.get(i),
        v => Some(v),
    }
}

fn bad(e: ParamError) -> Response {
    match e {
        ParamError::Contract(m) => reply(StatusCode::BAD_REQUEST, json!({"error": m})),
        ParamError::Unsupported(m) => refused(m),
    }
}

/// The prompts of the request: (ids per prompt, whether the input was a batch).
fn prompts(app: &Shared, body: &Value) -> Result<(Vec<Vec<u32>>, bool), Early> {
    let (text, ids) = (body.get("text"), body.get("input_ids"));
    let present = |v: Option<&Value>| v.is_some_and(|v| !v.is_null());
    if present(body.get("input_embeds")) {
        return Err(Box::new(refused(
            "input_embeds is not supported by tandem serve",
        )));
    }
    let early = |r: Response| Box::new(r);
    match (present(text), present(ids)) {
        (true, false) => match text {
            Some(Value::String(s)) => Ok((
                vec![app.text.encode(s, true).map_err(|e| early(refused(e)))?],
                false,
            )),
            Some(Value::Array(a)) => a
                .iter()
                .map(|s| match s {
                    Value::String(s) => app.text.encode(s, true).map_err(|e| early(refused(e))),
                    v => Err(early(invalid(format!("text: expected a string, got {v}")))),
                })
                .collect::<Result<_, _>>()
                .map(|p| (p, true)),
            Some(v) => Err(early(invalid(format!(
                "text: expected a string or a list, got {v}"
            )))),
            None => Err(early(invalid("text: missing"))),
        },
        (false, true) => {
            let Some(Value::Array(a)) = ids else {
                return Err(early(invalid(
                    "input_ids: expected a list of token ids or of lists",
                )));
            };
            if a.first().is_some_and(Value::is_array) {
                a.iter()
                    .map(|p| params::ids("input_ids", p))
                    .collect::<Result<_, _>>()
                    .map(|p| (p, true))
                    .map_err(|e| early(bad(e)))
            } else {
                params::ids("input_ids", ids.unwrap_or(&Value::Null))
                    .map(|p| (vec![p], false))
                    .map_err(|e| early(bad(e)))
            }
        }
        _ => Err(early(refused(
            "Either text, input_ids or input_embeds should be provided.",
        ))),
    }
}

/// `POST|PUT /generate`.
pub async fn generate(State(app): State<Shared>, body: Bytes) -> Response {
    let body: Value = match super::parse(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let (prompts, batch) = match prompts(&app, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let flag = |key: &str, i: usize| many(body.get(key), i).and_then(Value::as_bool) == Some(true);
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let top = body
        .get("top_logprobs_num")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 0);
    let group = app.server.lock().machine.version() ^ now().to_bits();
    let mut jobs = Vec::new();
    let mut seqs = Vec::new();
    for (i, prompt) in prompts.into_iter().enumerate() {
        let p: Params =
            match params::sglang(many(body.get("sampling_params"), i).unwrap_or(&Value::Null)) {
                Ok(p) => p,
                Err(e) => return bad(e),
            };
        if let Err(e) = app.text.check(&prompt, app.context_len) {
            return refused(format!("prompt {i}: {e}"));
        }
        let adapter = match many(body.get("lora_path"), i) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => return invalid(format!("lora_path: expected an adapter name, got {v}")),
        };
        if let Some(a) = &adapter
            && !app.server.lock().adapters.contains_key(a)
        {
            return refused(format!(
                "lora_path `{a}`: no adapter of that name is loaded"
            ));
        }
        let start = many(body.get("logprob_start_len"), i)
            .and_then(Value::as_i64)
            .filter(|s| *s >= 0 && flag("return_logprob", i));
        let input = match start.map(|s| usize::try_from(s).unwrap_or(usize::MAX)) {
            None => None,
            Some(_) if adapter.is_some() => {
                return refused(
                    "logprob_start_len with lora_path: tandem serve scores prompts under the \
                     base weights only (the engine ABI's score takes no adapter)",
                );
            }
            Some(s) if s >= prompt.len() => {
                return refused(format!(
                    "logprob_start_len {s} is not below the prompt's {} tokens",
                    prompt.len()
                ));
            }
            Some(s) => Some((s, prompt.clone())),
        };
        let rid = match many(body.get("rid"), i) {
            Some(Value::String(s)) => s.clone(),
            _ => format!("{group:016x}{i:08x}"),
        };
        let sampling = p.sampling(&app.text.eos, adapter, group.wrapping_add(i as u64));
        let chunk = stream.then(|| p.stream_interval.unwrap_or(8));
        for j in 0..p.n {
            let rid = if p.n > 1 {
                format!("{rid}-{j}")
            } else {
                rid.clone()
            };
            let (job, rx) = Job::new(
                rid.clone(),
                prompt.clone(),
                sampling.clone(),
                p.max_new,
                chunk,
            );
            jobs.push(job);
            seqs.push(Seq {
                rid,
                prompt_len: prompt.len(),
                logprob: flag("return_logprob", i),
                top,
                text_in_lp: flag("return_text_in_logprobs", i),
                skip_special: p.skip_special,
                input: input.clone(),
                rx,
            });
        }
    }
    let single = !batch && seqs.len() == 1;
    let started = now();
    app.server.submit(jobs);
    if stream {
        return stream_generate(app, seqs, started);
    }
    let mut dones = Vec::with_capacity(seqs.len());
    for s in &mut seqs {
        match collect(&mut s.rx).await {
            Ok(done) => dones.push(done),
            Err(e) => return refused(e),
        }
    }
    let mut inputs = match input_logprobs(&app, &seqs).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let mut out = Vec::with_capacity(seqs.len());
    for ((s, done), input) in seqs.iter().zip(&dones).zip(inputs.iter_mut()) {
        out.push(item(&app, s, done, started, input.take()));
    }
    if single {
        reply(StatusCode::OK, out.swap_remove(0))
    } else {
        reply(StatusCode::OK, Value::Array(out))
    }
}

/// SGLang's `finish_reason` object.
pub fn finish_json(f: &Finish, completion_tokens: usize) -> Value {
    match f {
        Finish::Stop(id) => json!({"type": "stop", "matched": id}),
        Finish::Length => json!({"type": "length", "length": completion_tokens}),
        Finish::Abort(m) => json!({"type": "abort", "message": m}),
    }
}

/// `meta_info.input_token_logprobs` of the sequences that asked for them (`logprob_start_len`
/// ≥ 0): the engine's `score` of the prompt, `[logprob, id, text]` from the start position, the
/// first prompt token's logprob `null` (as SGLang answers).
async fn input_logprobs(app: &Shared, seqs: &[Seq]) -> Result<Vec<Option<Value>>, Response> {
    let mut out: Vec<Option<Value>> = vec![None; seqs.len()];
    let want: Vec<(usize, usize, Vec<u32>)> = seqs
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.input.clone().map(|(start, p)| (i, start, p)))
        .collect();
    if want.is_empty() {
        return Ok(out);
    }
    let prompts: RVec<RVec<u32>> = want
        .iter()
        .map(|(_, _, p)| p.iter().copied().collect())
        .collect();
    let server = app.server.clone();
    let scored = super::blocking(move || server.engine.score(prompts).into_result()).await;
    let scored = scored.map_err(|e| refused(format!("input logprobs: {}", e.message)))?;
    for ((i, start, prompt), row) in want.into_iter().zip(scored.iter()) {
        let text = |id: u32| {
            if seqs[i].text_in_lp {
                Value::from(app.text.token(id))
            } else {
                Value::Null
            }
        };
        let triples = prompt.iter().enumerate().skip(start).map(|(j, &id)| {
            let lp = j
                .checked_sub(1)
                .and_then(|k| row.get(k))
                .map_or(Value::Null, |l| json!(l));
            json!([lp, id, text(id)])
        });
        out[i] = Some(Value::Array(triples.collect()));
    }
    Ok(out)
}

fn item(app: &Shared, s: &Seq, d: &Done, started: f64, input: Option<Value>) -> Value {
    let lp_text = |id: u32| {
        if s.text_in_lp {
            Value::from(app.text.token(id))
        } else {
            Value::Null
        }
    };
    let mut meta = json!({
        "id": s.rid,
        "finish_reason": finish_json(&d.finish, d.tokens.len()),
        "prompt_tokens": s.prompt_len,
        "completion_tokens": d.tokens.len(),
        "cached_tokens": 0,
        "weight_version": app.label(d.version),
        "num_retractions": 0,
        "e2e_latency": now() - started,
    });
    if s.logprob {
        let triples: Vec<Value> = d
            .tokens
            .iter()
            .zip(&d.logprobs)
            .map(|(&id, &lp)| json!([lp, id, lp_text(id)]))
            .collect();
        meta["output_token_logprobs"] = Value::Array(triples.clone());
        meta["input_token_logprobs"] = input.unwrap_or_else(|| json!([]));
        if s.top {
            meta["output_top_logprobs"] =
                Value::Array(triples.into_iter().map(|t| json!([t])).collect());
            meta["input_top_logprobs"] = json!([]);
        }
    }
    json!({
        "text": app.text.decode(&d.tokens, s.skip_special),
        "output_ids": d.tokens,
        "meta_info": meta,
    })
}

fn stream_generate(app: Shared, seqs: Vec<Seq>, started: f64) -> Response {
    let (sse, out) = Sse::channel();
    tokio::spawn(async move {
        let mut handles = Vec::new();
        for (index, mut s) in seqs.into_iter().enumerate() {
            let (app, out) = (app.clone(), out.clone());
            handles.push(tokio::spawn(async move {
                let mut d = Done {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    finish: Finish::Length,
                    version: app.server.lock().machine.version(),
                };
                while let Some(ev) = s.rx.recv().await {
                    let last = match ev {
                        Event::Tokens(t, l) => {
                            d.tokens.extend(t);
                            d.logprobs.extend(l);
                            false
                        }
                        Event::Done(f, v) => {
                            (d.finish, d.version) = (f, v);
                            true
                        }
                        Event::Error(e) => {
                            out.error(&e);
                            return;
                        }
                    };
                    let mut frame = item(&app, &s, &d, started, None);
                    frame["index"] = Value::from(index);
                    if !last {
                        frame["meta_info"]["finish_reason"] = Value::Null;
                    }
                    if !out.data(&frame) || last {
                        return;
                    }
                }
            }));
        }
        for h in handles {
            let _ = h.await;
        }
        out.done();
    });
    sse_response(sse)
}
