//! SGLang's control routes: health and info, loads, abort, pause / continue, flush,
//! release / resume by tag, weight updates from disk and version labels, the weight-update
//! session, the weights checker, LoRA load / unload. Each blocking engine call runs on
//! tokio's blocking pool ([`super::blocking`]); the lifecycle rules are in
//! [`crate::control`].

use std::collections::BTreeSet;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{App, Early, Shared, blocking, invalid, now, parse, refused, reply};
use crate::control::TAGS;
use crate::sched::ClientPause;

impl App {
    /// The `weight_version` label of engine version `v`.
    pub fn label(&self, v: u64) -> String {
        let g = self.server.lock();
        if g.machine.version() == v {
            g.label.clone()
        } else {
            v.to_string()
        }
    }
}

/// `GET /health`, `/health_generate`: 200 unless the engine reports damaged weights.
pub async fn health(State(app): State<Shared>) -> StatusCode {
    let serving = app.server.lock().machine.can_generate();
    let h = blocking(move || app.server.engine.health().into_result()).await;
    match h {
        Ok(h) if h.ready || !serving => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `GET /ready`: 503 while paused by a client.
pub async fn ready(State(app): State<Shared>) -> StatusCode {
    if app.server.lock().pause.is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// `GET /model_info`.
pub async fn model_info(State(app): State<Shared>) -> Response {
    let label = app.server.lock().label.clone();
    reply(
        StatusCode::OK,
        json!({"model_path": app.model_path, "served_model_name": app.model_name,
            "tokenizer_path": app.model_path, "is_generation": true,
            "preferred_sampling_params": null, "weight_version": label, "load_format": "auto",
            "reasoning_parser": null, "tool_call_parser": null, "disaggregation_mode": "null",
            "has_image_understanding": false, "has_audio_understanding": false,
            "model_type": null, "architectures": null}),
    )
}

/// `GET /server_info`.
pub async fn server_info(State(app): State<Shared>) -> Response {
    let (running, waiting) = app.server.lock().loads();
    let mut info = app.args.clone();
    info["startup_time"] = json!(app.started);
    info["internal_states"] = json!([{"num_running_reqs": running, "num_waiting_reqs": waiting}]);
    info["version"] = json!(env!("CARGO_PKG_VERSION"));
    info["frontend"] = json!("tandem");
    reply(StatusCode::OK, info)
}

/// `GET /v1/loads?include=core`.
pub async fn loads(State(app): State<Shared>) -> Response {
    let (running, waiting) = app.server.lock().loads();
    reply(
        StatusCode::OK,
        json!({"timestamp": iso8601(now()), "version": env!("CARGO_PKG_VERSION"),
            "accelerator": null,
            "num_accelerators": 0,
            "loads": [{"timestamp": now(), "dp_rank": 0, "num_running_reqs": running,
                       "num_waiting_reqs": waiting}]}),
    )
}

/// `YYYY-MM-DDTHH:MM:SS.ffffff+00:00` of a Unix time (what SGLang's `/v1/loads` writes).
fn iso8601(t: f64) -> String {
    let secs = t.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let micros = ((t - secs as f64) * 1e6) as u32;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Deserialize)]
struct AbortReq {
    #[serde(default)]
    rid: String,
    #[serde(default)]
    abort_all: bool,
}

/// `POST /abort_request`: 200 empty.
pub async fn abort_request(State(app): State<Shared>, body: Bytes) -> Response {
    let req: AbortReq = match parse(&body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let rid = (!req.abort_all).then_some(req.rid);
    match blocking(move || app.server.abort_request(rid.as_deref())).await {
        Ok(_) => StatusCode::OK.into_response(),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
struct PauseReq {
    #[serde(default = "abort_mode")]
    mode: String,
}

fn abort_mode() -> String {
    "abort".into()
}

/// `POST /pause_generation {mode}`.
pub async fn pause(State(app): State<Shared>, body: Bytes) -> Response {
    let req: PauseReq = match parse(&body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let mode = match req.mode.as_str() {
        "abort" => ClientPause::Abort,
        "retract" => ClientPause::Retract,
        "in_place" => ClientPause::InPlace,
        m => {
            return invalid(format!(
                "mode: input should be 'abort', 'retract' or 'in_place', got '{m}'"
            ));
        }
    };
    match blocking(move || app.server.pause(mode)).await {
        Ok(()) => reply(
            StatusCode::OK,
            json!({"message": "Generation paused successfully.", "status": "ok"}),
        ),
        Err(e) => refused(e),
    }
}

/// `POST /continue_generation`.
pub async fn continue_generation(State(app): State<Shared>) -> Response {
    match blocking(move || app.server.continue_generation()).await {
        Ok(()) => reply(
            StatusCode::OK,
            json!({"message": "Generation continued successfully.", "status": "ok"}),
        ),
        Err(e) => refused(e),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// `GET|POST /flush_cache[?timeout=S]`: 200 text, or 400 text while requests run (after
/// waiting up to `timeout` seconds for them).
pub async fn flush(State(app): State<Shared>, RawQuery(query): RawQuery) -> Response {
    let timeout = query
        .as_deref()
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeout="))
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(|t| std::time::Duration::from_secs_f64(t.min(3600.0)));
    match blocking(move || app.server.flush(timeout)).await {
        Ok(()) => text(
            StatusCode::OK,
            "Cache flushed.\nPlease check backend logs for more details. (When there are \
             running or waiting requests, the operation will not be performed.)\n"
                .into(),
        ),
        Err(e) => text(
            StatusCode::BAD_REQUEST,
            format!(
                "Cache not flushed: {e}. (When there are running or waiting requests, the operation will not be performed.)\n"
            ),
        ),
    }
}

#[derive(Deserialize)]
struct TagsReq {
    #[serde(default)]
    tags: Option<Vec<String>>,
}

fn tags(app: &App, body: &Bytes) -> Result<BTreeSet<String>, Early> {
    let req: TagsReq = parse(body)?;
    if !app.memory_saver {
        return Err(Box::new(refused(
            "memory occupation control needs --enable-memory-saver (tandem serve)",
        )));
    }
    let tags: BTreeSet<String> = match req.tags {
        Some(t) if !t.is_empty() => t.into_iter().collect(),
        _ => TAGS.iter().map(|t| t.to_string()).collect(),
    };
    if let Some(t) = tags.iter().find(|t| !TAGS.contains(&t.as_str())) {
        return Err(Box::new(refused(format!(
            "unknown tag `{t}`; the tags are kv_cache, weights, cuda_graph"
        ))));
    }
    Ok(tags)
}

/// `GET|POST /release_memory_occupation {tags}`: 200 `null`.
pub async fn release(State(app): State<Shared>, body: Bytes) -> Response {
    let tags = match tags(&app, &body) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    match blocking(move || app.server.release(tags)).await {
        Ok(()) => reply(StatusCode::OK, Value::Null),
        Err(e) => refused(e),
    }
}

/// `GET|POST /resume_memory_occupation {tags}`: 200 `null`.
pub async fn resume(State(app): State<Shared>, body: Bytes) -> Response {
    let tags = match tags(&app, &body) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    match blocking(move || app.server.resume(tags)).await {
        Ok(()) => reply(StatusCode::OK, Value::Null),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
struct DiskReq {
    model_path: String,
    #[serde(default)]
    weight_version: Option<String>,
    #[serde(default)]
    abort_all_requests: bool,
}

/// The engine version and label of a wire `weight_version` (plan §3): a decimal u64 is that
/// version; another label is the served version + 1; none keeps both.
fn version_of(app: &App, label: Option<String>) -> (u64, Option<String>) {
    let served = app.server.lock().machine.version();
    match label {
        None => (served, None),
        Some(l) => match l.parse::<u64>() {
            Ok(v) => (v, Some(l)),
            Err(_) => (served + 1, Some(l)),
        },
    }
}

/// `POST /update_weights_from_disk`.
pub async fn update_from_disk(State(app): State<Shared>, body: Bytes) -> Response {
    let req: DiskReq = match parse(&body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if req.abort_all_requests {
        app.server.lock().abort(None, "aborted for a weight update");
    }
    let (version, label) = version_of(&app, req.weight_version);
    let dir = req.model_path;
    let out = blocking(move || app.server.update_from_disk(&dir, version, label)).await;
    match out {
        Ok(()) => reply(
            StatusCode::OK,
            json!({"success": true, "message": "Succeeded to update model weights.",
                   "num_paused_requests": 0}),
        ),
        Err(e) => reply(
            StatusCode::BAD_REQUEST,
            json!({"success": false, "message": e, "num_paused_requests": 0}),
        ),
    }
}

#[derive(Deserialize)]
struct VersionReq {
    new_version: String,
    #[serde(default = "yes")]
    abort_all_requests: bool,
}

fn yes() -> bool {
    true
}

/// `POST /update_weight_version`: relabels the served weights.
pub async fn update_weight_version(State(app): State<Shared>, body: Bytes) -> Response {
    let req: VersionReq = match parse(&body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let mut g = app.server.lock();
    if req.abort_all_requests {
        g.abort(None, "aborted by /update_weight_version");
    }
    g.label = req.new_version.clone();
    reply(
        StatusCode::OK,
        json!({"success": true, "message": "Weight version updated.",
               "new_version": req.new_version}),
    )
}

fn outcome(ok: bool, message: &str) -> Response {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    reply(status, json!({"success": ok, "message": message}))
}

/// `POST /begin_weight_update`.
pub async fn begin_update(State(app): State<Shared>) -> Response {
    let mut g = app.server.lock();
    if g.update_session {
        return outcome(false, "a weight update session is already open");
    }
    g.update_session = true;
    outcome(true, "weight update session opened")
}

/// `POST /end_weight_update`.
pub async fn end_update(State(app): State<Shared>) -> Response {
    let mut g = app.server.lock();
    if !g.update_session {
        return outcome(false, "no weight update session is open");
    }
    g.update_session = false;
    outcome(true, "weight update session closed")
}

#[derive(Deserialize)]
struct CheckReq {
    #[serde(default = "checksum")]
    action: String,
}

fn checksum() -> String {
    "checksum".into()
}

/// `GET|POST /weights_checker {action}`: `checksum` answers with the served version and, in
/// `checksum`, the run directory's weights digest ([`tandem_plugin_api::files::digest`]) of
/// the directory the served weights were loaded from (the model, or the last
/// `/update_weights_from_disk`): computed from its files once, on the first request after a
/// load, off the async threads.
pub async fn weights_checker(State(app): State<Shared>, body: Bytes) -> Response {
    let req: CheckReq = match parse(&body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if req.action != "checksum" {
        return outcome(
            false,
            &format!("action `{}` is not supported by tandem serve", req.action),
        );
    }
    let (label, (dir, known)) = {
        let g = app.server.lock();
        (g.label.clone(), g.weights_dir.clone())
    };
    let digest = match known {
        Some(d) => Ok(d),
        None => {
            let at = dir.clone();
            tokio::task::spawn_blocking(move || {
                tandem_plugin_api::files::digest::digest_dir(std::path::Path::new(&at))
                    .map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(format!("the digest task failed: {e}")))
        }
    };
    match digest {
        Ok(d) => {
            let mut g = app.server.lock();
            if g.weights_dir.0 == dir {
                g.weights_dir.1 = Some(d.clone());
            }
            drop(g);
            reply(
                StatusCode::OK,
                json!({"success": true, "message": format!("weights at version {label} from {dir}"), "checksum": d}),
            )
        }
        Err(e) => outcome(false, &format!("checksum of the weights in {dir}: {e}")),
    }
}

#[cfg(test)]
#[test]
fn iso8601_writes_utc_dates() {
    assert_eq!(iso8601(0.0), "1970-01-01T00:00:00.000000+00:00");
    assert_eq!(iso8601(951_782_400.5), "2000-02-29T00:00:00.500000+00:00");
    assert_eq!(iso8601(1_795_786_651.0), "2026-11-27T13:37:31.000000+00:00");
}

#[derive(Deserialize)]
struct LoraReq {
    lora_name: String,
    #[serde(default)]
    lora_path: Option<String>,
}

fn lora_reply(app: &App, r: Result<(), String>) -> Response {
    let loaded: serde_json::Map<String, Value> = app
        .server
        .lock()
        .adapters
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let (status, ok, err) = match r {
        Ok(()) => (StatusCode::OK, true, Value::Null),
        Err(e) => (StatusCode::BAD_REQUEST, false, json!(e)),
    };
    reply(
        status,
        json!({"rid": null, "http_worker_ipc": null, "success": ok, "error_message": err,
               "loaded_adapters": loaded}),
    )
}

fn lora_req(app: &App, body: &Bytes) -> Result<LoraReq, Early> {
    let req: LoraReq = parse(body)?;
    if !app.lora {
        return Err(Box::new(refused(
            "LoRA is not enabled: start tandem serve with --enable-lora",
        )));
    }
    Ok(req)
}

/// `POST /load_lora_adapter {lora_name, lora_path}`.
pub async fn load_lora(State(app): State<Shared>, body: Bytes) -> Response {
    let req = match lora_req(&app, &body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let Some(path) = req.lora_path else {
        return invalid("lora_path: field required");
    };
    let a = app.clone();
    let r = blocking(move || a.server.load_adapter(&req.lora_name, &path)).await;
    lora_reply(&app, r)
}

/// `POST /unload_lora_adapter {lora_name}`.
pub async fn unload_lora(State(app): State<Shared>, body: Bytes) -> Response {
    let req = match lora_req(&app, &body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let a = app.clone();
    let r = blocking(move || a.server.unload_adapter(&req.lora_name)).await;
    lora_reply(&app, r)
}
