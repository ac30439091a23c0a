//! Server-sent events: a channel whose receiving end is the response body (`data: <json>\n\n`
//! frames, ending `data: [DONE]\n\n`), and the streaming forms of `/v1/completions` and
//! `/v1/chat/completions` (one chunk per engine call of `stream_interval` tokens).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::native::Done;
use super::openai::{Choice, Kind, Prepared, chat_logprobs, completion_logprobs, finish_name};
use super::{Shared, now};
use crate::sched::{Event, Finish};
use crate::text::Incremental;

/// The body side of an SSE channel.
pub struct Sse(UnboundedReceiver<Bytes>);

/// The sending side.
#[derive(Clone)]
pub struct SseOut(UnboundedSender<Bytes>);

impl Sse {
    /// A new channel.
    pub fn channel() -> (Sse, SseOut) {
        let (tx, rx) = unbounded_channel();
        (Sse(rx), SseOut(tx))
    }
}

impl futures_core::Stream for Sse {
    type Item = Result<Bytes, std::convert::Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|b| b.map(Ok))
    }
}

impl SseOut {
    /// Sends one `data:` frame; `false` once the client is gone.
    pub fn data(&self, v: &Value) -> bool {
        self.0.send(Bytes::from(format!("data: {v}\n\n"))).is_ok()
    }

    /// An in-stream error (SGLang's shape); the stream still ends with `[DONE]`.
    pub fn error(&self, message: &str) {
        self.data(
            &json!({"error": {"message": message, "type": "invalid_request_error",
                                     "code": 400, "retryable": false}}),
        );
    }

    /// The final `data: [DONE]`.
    pub fn done(&self) {
        let _ = self.0.send(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

/// The streaming response.
pub fn sse_response(sse: Sse) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(sse),
    )
        .into_response()
}

/// Streams an OpenAI request's choices.
pub fn stream_openai(app: Shared, prep: Prepared, kind: Kind, choices: Vec<Choice>) -> Response {
    let (sse, out) = Sse::channel();
    let id = prep.id.clone();
    let created = now() as u64;
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let model = prep.model.clone();
    let head = move |choice: Value| {
        json!({"id": id, "object": object, "created": created, "model": model,
               "choices": [choice]})
    };
    tokio::spawn(async move {
        let mut handles = Vec::new();
        for (index, mut c) in choices.into_iter().enumerate() {
            let (app, out, head) = (app.clone(), out.clone(), head.clone());
            let lp = prep.logprobs;
            let skip = prep.params.skip_special;
            handles.push(tokio::spawn(async move {
                let mut inc = Incremental::default();
                let mut done = Done {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    finish: Finish::Length,
                    version: 0,
                };
                let mut offset = c.echo.len();
                if kind == Kind::Chat {
                    let delta = json!({"role": "assistant", "content": ""});
                    out.data(&head(
                        json!({"index": index, "delta": delta, "logprobs": null,
                                          "finish_reason": null}),
                    ));
                } else if !c.echo.is_empty() {
                    out.data(&head(
                        json!({"index": index, "text": c.echo, "logprobs": null,
                                          "finish_reason": null}),
                    ));
                }
                while let Some(ev) = c.rx.recv().await {
                    let (text, tokens, lps, finish) = match ev {
                        Event::Tokens(t, l) => {
                            done.tokens.extend(&t);
                            (inc.push(&app.text, &t, skip), t, l, None)
                        }
                        Event::Done(f, v) => {
                            done.version = v;
                            (inc.finish(&app.text, skip), vec![], vec![], Some(f))
                        }
                        Event::Error(e) => {
                            out.error(&e);
                            return (0, 0);
                        }
                    };
                    let logprobs = match (lp, kind) {
                        (None, _) => Value::Null,
                        (Some(k), Kind::Completion) => {
                            let v = completion_logprobs(&app, &tokens, &lps, k, offset);
                            offset += text.len();
                            v
                        }
                        (Some(k), Kind::Chat) => chat_logprobs(&app, &tokens, &lps, k),
                    };
                    let reason = finish.as_ref().map(finish_name);
                    let matched = match &finish {
                        Some(Finish::Stop(id)) => json!(id),
                        _ => Value::Null,
                    };
                    let mut choice = match kind {
                        Kind::Completion => json!({"index": index, "text": text,
                            "logprobs": logprobs, "finish_reason": reason}),
                        Kind::Chat => json!({"index": index, "delta": {"content": text},
                            "logprobs": logprobs, "finish_reason": reason}),
                    };
                    if finish.is_some() {
                        choice["matched_stop"] = matched;
                    }
                    if !out.data(&head(choice)) || finish.is_some() {
                        break;
                    }
                }
                (c.prompt_len, done.tokens.len())
            }));
        }
        let (mut prompt, mut completion) = (0, 0);
        for h in handles {
            if let Ok((p, n)) = h.await {
                prompt += p;
                completion += n;
            }
        }
        if prep.include_usage {
            out.data(&json!({"id": prep.id, "object": object, "created": created,
                "model": prep.model, "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}));
        }
        out.done();
    });
    sse_response(sse)
}
