//! SGLang's control routes on `tandem serve`: pause modes, blocked requests, abort, flush
//! refused while a request waits, release / resume order and errors, weight updates from
//! disk with versions, LoRA refusals.

use super::{PROMPT, Srv, greedy, models, tandem_generate};
use serde_json::{Value, json};
use std::thread::JoinHandle;

/// A `/generate` on another thread (it may block).
fn background(srv: &Srv, body: Value) -> JoinHandle<(u16, Value)> {
    let url = srv.url.clone();
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent
            .post(format!("{url}/generate"))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap();
        let s = r.status().as_u16();
        (
            s,
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap(),
        )
    })
}

fn ok(srv: &Srv, path: &str, body: Value) -> Value {
    let (s, v) = srv.post(path, &body);
    assert_eq!(s, 200, "{path}: {v}");
    v
}

#[test]
fn paused_server_blocks_generate_until_continue() {
    let srv = Srv::start(&[]);
    let (_, expected) = srv.post("/generate", &greedy(&PROMPT, 4));
    let v = ok(&srv, "/pause_generation", json!({}));
    assert_eq!(
        v,
        json!({"message": "Generation paused successfully.", "status": "ok"})
    );
    assert_eq!(srv.get("/ready").0, 503);
    let waiting = background(&srv, greedy(&PROMPT, 4));
    srv.wait_loads(0, 1);
    assert!(!waiting.is_finished());
    // Paused (abort mode): waiting requests are ignored by flush.
    assert_eq!(srv.get("/flush_cache").0, 200);
    ok(&srv, "/continue_generation", json!({}));
    let (s, out) = waiting.join().unwrap();
    assert_eq!(s, 200);
    assert_eq!(out["output_ids"], expected["output_ids"]);
    assert_eq!(srv.get("/ready").0, 200);
}

#[test]
fn pause_abort_and_abort_request_finish_waiting_requests_as_aborted() {
    let srv = Srv::start(&[]);
    ok(&srv, "/pause_generation", json!({"mode": "in_place"}));
    let mut body = greedy(&PROMPT, 4);
    body["rid"] = json!("r1");
    let first = background(&srv, body);
    srv.wait_loads(0, 1);
    assert_eq!(srv.post("/abort_request", &json!({"rid": "r1"})).0, 200);
    let (s, out) = first.join().unwrap();
    assert_eq!(s, 200);
    assert_eq!(out["meta_info"]["finish_reason"]["type"], "abort", "{out}");
    assert_eq!(out["meta_info"]["id"], "r1");
    let second = background(&srv, greedy(&PROMPT, 4));
    srv.wait_loads(0, 1);
    ok(&srv, "/pause_generation", json!({"mode": "abort"}));
    let (_, out) = second.join().unwrap();
    assert_eq!(out["meta_info"]["finish_reason"]["type"], "abort", "{out}");
    ok(&srv, "/continue_generation", json!({}));
    assert_eq!(srv.post("/generate", &greedy(&PROMPT, 2)).0, 200);
    let (s, v) = srv.post("/pause_generation", &json!({"mode": "sideways"}));
    assert_eq!((s, &v["type"]), (400, &json!("Bad Request")), "{v}");
}

#[test]
fn flush_refused_while_a_request_waits_and_release_resume_order() {
    let srv = Srv::start(&["--enable-memory-saver"]);
    let (_, expected) = srv.post("/generate", &greedy(&PROMPT, 5));
    // Idle: flush works, twice.
    assert_eq!(srv.get("/flush_cache").0, 200);
    assert_eq!(srv.post("/flush_cache", &json!({})).0, 200);
    // Release everything on an idle, unpaused server (SGLang's lax model).
    let (s, v) = srv.post("/release_memory_occupation", &json!({}));
    assert_eq!((s, v), (200, Value::Null));
    let (s, v) = srv.post("/release_memory_occupation", &json!({"tags": ["weights"]}));
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already released")
    );
    // A request now waits (not paused, memory released): flush is refused.
    let waiting = background(&srv, greedy(&PROMPT, 5));
    srv.wait_loads(0, 1);
    let (s, text) = srv.get("/flush_cache");
    assert_eq!(s, 400, "{text}");
    assert!(text.as_str().unwrap().starts_with("Cache not flushed"));
    // Paused in retract mode: waiting requests are ignored.
    ok(&srv, "/pause_generation", json!({"mode": "retract"}));
    assert_eq!(srv.get("/flush_cache").0, 200);
    // Weights first, then the rest; a tag not released is refused.
    let (s, v) = srv.post("/resume_memory_occupation", &json!({"tags": ["weights"]}));
    assert_eq!((s, v), (200, Value::Null));
    let (s, v) = srv.post("/resume_memory_occupation", &json!({"tags": ["weights"]}));
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not released")
    );
    let (s, v) = srv.post("/resume_memory_occupation", &json!({"tags": ["bogus"]}));
    assert_eq!(s, 400, "{v}");
    let (s, _) = srv.post(
        "/resume_memory_occupation",
        &json!({"tags": ["kv_cache", "cuda_graph"]}),
    );
    assert_eq!(s, 200);
    // Still paused by the client: the request waits until continue.
    srv.wait_loads(0, 1);
    ok(&srv, "/continue_generation", json!({}));
    let (s, out) = waiting.join().unwrap();
    assert_eq!(s, 200);
    assert_eq!(out["output_ids"], expected["output_ids"]);
    assert_eq!(
        out["meta_info"]["output_token_logprobs"],
        expected["meta_info"]["output_token_logprobs"]
    );
}

#[test]
fn in_place_keeps_a_started_stream_and_flush_refuses_until_retract() {
    let srv = Srv::start(&[]);
    let mut body = greedy(&PROMPT, 240);
    body["sampling_params"]["ignore_eos"] = json!(true);
    let (_, whole) = srv.post("/generate", &body);
    body["stream"] = json!(true);
    body["sampling_params"]["stream_interval"] = json!(1);
    // A stream of 240 one-token chunks is paused after its first frame. On a starved machine
    // it may still finish before the pause lands; then the scenario is tried again (the state
    // is read from the server, never assumed from timing).
    for attempt in 1..=5 {
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        let url = srv.url.clone();
        let body = body.clone();
        let reader = std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
            let resp = agent
                .post(format!("{url}/generate"))
                .header("content-type", "application/json")
                .send(body.to_string().as_bytes())
                .unwrap();
            let mut frames = Vec::new();
            for line in
                std::io::BufRead::lines(std::io::BufReader::new(resp.into_body().into_reader()))
            {
                if let Some(d) = line.unwrap().strip_prefix("data: ") {
                    if frames.is_empty() {
                        first_tx.send(()).unwrap();
                    }
                    frames.push(d.to_owned());
                }
            }
            frames
        });
        first_rx.recv().unwrap();
        ok(&srv, "/pause_generation", json!({"mode": "in_place"}));
        let (_, loads) = srv.get("/v1/loads?include=core");
        if loads["loads"][0]["num_running_reqs"] != 1 {
            // Finished before the pause: nothing was kept in place.
            ok(&srv, "/continue_generation", json!({}));
            reader.join().unwrap();
            assert!(
                attempt < 5,
                "the stream always finished before the pause: {loads}"
            );
            continue;
        }
        let (s, text) = srv.get("/flush_cache");
        assert_eq!(
            s, 400,
            "in place: the started request keeps its cache: {text}"
        );
        ok(&srv, "/pause_generation", json!({"mode": "retract"}));
        srv.wait_loads(0, 1);
        assert_eq!(srv.get("/flush_cache").0, 200);
        ok(&srv, "/continue_generation", json!({}));
        let frames = reader.join().unwrap();
        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
        let last: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
        assert_eq!(
            last["output_ids"], whole["output_ids"],
            "recomputed after retract"
        );
        assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
        return;
    }
}

#[test]
fn memory_and_lora_routes_need_their_flags() {
    let srv = Srv::start(&[]);
    let (s, v) = srv.post("/release_memory_occupation", &json!({}));
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--enable-memory-saver")
    );
    let body = json!({"lora_name": "a", "lora_path": "/nonexistent"});
    let (s, v) = srv.post("/load_lora_adapter", &body);
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--enable-lora")
    );
    let srv = Srv::start(&["--enable-lora"]);
    let (s, v) = srv.post("/load_lora_adapter", &body);
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["success"], false);
    assert!(v["error_message"].is_string());
    assert_eq!(v["loaded_adapters"], json!({}));
    let (s, v) = srv.post("/unload_lora_adapter", &json!({"lora_name": "a"}));
    assert_eq!((s, &v["success"]), (400, &json!(false)), "{v}");
}

#[test]
fn update_weights_from_disk_with_versions() {
    let (base, v2) = models();
    let srv = Srv::start_model(base, &[]);
    let (_, info) = srv.get("/model_info");
    assert_eq!(info["weight_version"], "default");
    let body = json!({"model_path": v2, "weight_version": "2"});
    let v = ok(&srv, "/update_weights_from_disk", body);
    assert_eq!(v["success"], true);
    assert_eq!(v["num_paused_requests"], 0);
    let (_, out) = srv.post("/generate", &greedy(&PROMPT, 6));
    let reference = tandem_generate(v2, &PROMPT, 6);
    assert_eq!(out["output_ids"], reference["tokens"]);
    assert_eq!(out["meta_info"]["weight_version"], "2");
    assert_eq!(srv.get("/model_info").1["weight_version"], "2");
    // A lower version is refused; the served weights stay.
    let (s, v) = srv.post(
        "/update_weights_from_disk",
        &json!({"model_path": base, "weight_version": "1"}),
    );
    assert_eq!(s, 400);
    assert_eq!(v["success"], false);
    assert!(v["message"].as_str().unwrap().contains("below"), "{v}");
    let (_, again) = srv.post("/generate", &greedy(&PROMPT, 6));
    assert_eq!(again["output_ids"], reference["tokens"]);
    // A label that is no number: accepted, the engine version goes up by one.
    let body = json!({"model_path": base, "weight_version": "step-3"});
    ok(&srv, "/update_weights_from_disk", body);
    let (_, out) = srv.post("/generate", &greedy(&PROMPT, 6));
    assert_eq!(out["meta_info"]["weight_version"], "step-3");
    let (s, _) = srv.post(
        "/update_weights_from_disk",
        &json!({"model_path": base, "weight_version": "2"}),
    );
    assert_eq!(s, 400, "version 3 is served now");
    // Relabel only; begin/end session rules.
    let v = ok(&srv, "/update_weight_version", json!({"new_version": "7"}));
    assert_eq!(v["new_version"], "7");
    assert_eq!(srv.get("/model_info").1["weight_version"], "7");
    ok(&srv, "/begin_weight_update", json!({}));
    assert_eq!(srv.post("/begin_weight_update", &json!({})).0, 400);
    ok(&srv, "/end_weight_update", json!({}));
    assert_eq!(srv.post("/end_weight_update", &json!({})).0, 400);
    // The checksum is the weights digest of the directory last loaded, from its files.
    let v = ok(&srv, "/weights_checker", json!({"action": "checksum"}));
    assert_eq!(v["success"], true);
    let want = tandem_plugin_api::files::digest::digest_dir(std::path::Path::new(base)).unwrap();
    assert_eq!(v["checksum"], want.as_str(), "{v}");
    assert_eq!(
        ok(&srv, "/weights_checker", json!({}))["checksum"],
        want.as_str()
    );
}
