//! The HTTP side: the router (SGLang's native routes, OpenAI's `/v1` routes), bearer-token
//! auth, and the error shapes of SGLang 0.5.23:
//! - a request body that does not parse or has the wrong types: 400
//!   `{"object":"error","message","type":"Bad Request","param":null,"code":400}`;
//! - a handler's refusal: 400 `{"error":{"message}}`;
//! - `/generate`'s request contract (unknown `sampling_params` keys): 400 `{"error": "..."}`;
//! - OpenAI routes: SGLang's `ErrorResponse` `{"object":"error","message","type","param","code"}`;
//! - a missing or wrong key: 401 `{"error":"Unauthorized"}`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::sched::Server;
use crate::text::ModelText;

mod admin;
mod native;
mod openai;
mod openai_stream;
mod params;

/// What every handler shares.
pub struct App {
    /// Batcher + engine.
    pub server: Arc<Server>,
    /// Tokenizer, stop ids, chat template.
    pub text: ModelText,
    /// The model name (`--served-model-name`, else the directory).
    pub model_name: String,
    /// The served directory as given.
    pub model_path: String,
    /// Bearer token, if any.
    pub api_key: Option<String>,
    /// `--enable-memory-saver`.
    pub memory_saver: bool,
    /// `--enable-lora`.
    pub lora: bool,
    /// Longest prompt + completion.
    pub context_len: usize,
    /// Unix time the server started.
    pub started: f64,
    /// The resolved arguments `/server_info` reports.
    pub args: Value,
}

/// Shared handler state.
pub type Shared = Arc<App>;

/// Seconds since the epoch.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// JSON with a status.
pub fn reply(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// SGLang's validation error (400).
pub fn invalid(message: impl Into<String>) -> Response {
    reply(
        StatusCode::BAD_REQUEST,
        json!({"object": "error", "message": message.into(), "type": "Bad Request",
               "param": null, "code": 400}),
    )
}

/// SGLang's handler error (400 `{"error":{"message}}`).
pub fn refused(message: impl Into<String>) -> Response {
    reply(
        StatusCode::BAD_REQUEST,
        json!({"error": {"message": message.into()}}),
    )
}

/// SGLang's OpenAI `ErrorResponse`.
pub fn openai_error(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = match status {
        StatusCode::BAD_REQUEST => "BadRequestError",
        StatusCode::NOT_FOUND => "NotFoundError",
        _ => "InternalServerError",
    };
    reply(
        status,
        json!({"object": "error", "message": message.into(), "type": kind, "param": null,
               "code": status.as_u16()}),
    )
}

/// A response returned early (boxed: a `Response` is large).
pub type Early = Box<Response>;

/// The body as `T` (an empty body reads as `{}`); errors are SGLang's validation shape.
pub fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Early> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| Box::new(invalid(format!("invalid request body: {e}"))))
}

/// Runs blocking engine work off the async threads.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The router over `app`.
pub fn router(app: Shared) -> Router {
    Router::new()
        .route("/health", get(admin::health))
        .route("/health_generate", get(admin::health))
        .route("/ready", get(admin::ready))
        .route("/ping", get(|| async { StatusCode::OK }))
        .route("/model_info", get(admin::model_info))
        .route("/get_model_info", get(admin::model_info))
        .route("/server_info", get(admin::server_info))
        .route("/get_server_info", get(admin::server_info))
        .route("/v1/loads", get(admin::loads))
        .route("/generate", post(native::generate).put(native::generate))
        .route("/abort_request", post(admin::abort_request))
        .route("/pause_generation", post(admin::pause))
        .route("/continue_generation", post(admin::continue_generation))
        .route("/flush_cache", get(admin::flush).post(admin::flush))
        .route(
            "/release_memory_occupation",
            get(admin::release).post(admin::release),
        )
        .route(
            "/resume_memory_occupation",
            get(admin::resume).post(admin::resume),
        )
        .route("/update_weights_from_disk", post(admin::update_from_disk))
        .route("/update_weight_version", post(admin::update_weight_version))
        .route("/begin_weight_update", post(admin::begin_update))
        .route("/end_weight_update", post(admin::end_update))
        .route(
            "/weights_checker",
            get(admin::weights_checker).post(admin::weights_checker),
        )
        .route("/load_lora_adapter", post(admin::load_lora))
        .route("/unload_lora_adapter", post(admin::unload_lora))
        .route("/v1/models", get(openai::models))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat))
        .fallback(|| async { reply(StatusCode::NOT_FOUND, json!({"detail": "Not Found"})) })
        .layer(middleware::from_fn_with_state(app.clone(), auth))
        .with_state(app)
}

/// Routes open without a key (SGLang: health and readiness probes).
fn open_route(path: &str) -> bool {
    matches!(
        path,
        "/health" | "/health_generate" | "/ready" | "/ping" | "/metrics"
    )
}

async fn auth(State(app): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key
        && !open_route(req.uri().path())
    {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return reply(StatusCode::UNAUTHORIZED, json!({"error": "Unauthorized"}));
        }
    }
    next.run(req).await
}
