//! SGLang's `/generate` against `tandem generate` (tokens, logprobs, score), batches,
//! streaming, error shapes and auth.

use super::{PROMPT, Srv, close, f32s, greedy, models, tandem_generate, triple_lps};
use serde_json::{Value, json};

#[test]
fn generate_equals_tandem_generate_tokens_logprobs_and_score() {
    let srv = Srv::start(&[]);
    let (s, out) = srv.post("/generate", &greedy(&PROMPT, 12));
    assert_eq!(s, 200, "{out}");
    let reference = tandem_generate(&models().0, &PROMPT, 12);
    assert_eq!(out["output_ids"], reference["tokens"]);
    let meta = &out["meta_info"];
    let triples = meta["output_token_logprobs"].as_array().unwrap();
    let ids: Vec<Value> = triples.iter().map(|t| t[1].clone()).collect();
    assert_eq!(Value::Array(ids), reference["tokens"]);
    let lps = triple_lps(&meta["output_token_logprobs"]);
    assert_eq!(
        lps,
        f32s(&reference["logprobs"]),
        "bit-equal to the engine's"
    );
    assert!(triples.iter().all(|t| t[2].is_null()));
    // `--score` on prompt + completion: the completion's part equals the served logprobs.
    let score = f32s(&reference["score"]);
    let tail = &score[PROMPT.len() - 1..];
    for (a, b) in lps.iter().zip(tail) {
        assert!((a - b).abs() <= 1e-4, "{a} vs score {b}");
    }
    assert_eq!(meta["prompt_tokens"], PROMPT.len());
    assert_eq!(meta["completion_tokens"], 12);
    assert_eq!(meta["weight_version"], "default");
    let reason = &meta["finish_reason"];
    let n = reference["tokens"].as_array().unwrap().len();
    match reference["finish_reason"].as_str().unwrap() {
        "length" => assert_eq!(reason, &json!({"type": "length", "length": n})),
        _ => assert_eq!(reason["type"], "stop"),
    }
}

#[test]
fn batch_generate_equals_single_requests() {
    let srv = Srv::start(&[]);
    let other = [3u32, 5, 8, 13];
    let body = json!({"input_ids": [PROMPT, other], "return_logprob": true,
                      "sampling_params": {"temperature": 0, "max_new_tokens": 6}});
    let (s, out) = srv.post("/generate", &body);
    assert_eq!(s, 200, "{out}");
    let items = out.as_array().unwrap();
    assert_eq!(items.len(), 2);
    for (item, p) in items.iter().zip([&PROMPT[..], &other[..]]) {
        let (_, single) = srv.post("/generate", &greedy(p, 6));
        assert_eq!(item["output_ids"], single["output_ids"]);
        // Another batch shape: the same tokens, logprobs equal to rounding.
        close(
            &triple_lps(&item["meta_info"]["output_token_logprobs"]),
            &triple_lps(&single["meta_info"]["output_token_logprobs"]),
            1e-5,
        );
    }
    // Concurrent clients get what each would alone (they share engine calls).
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let url = srv.url.clone();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let p = if i % 2 == 0 {
                    PROMPT.to_vec()
                } else {
                    other.to_vec()
                };
                let mut r = agent
                    .post(format!("{url}/generate"))
                    .header("content-type", "application/json")
                    .send(greedy(&p, 6).to_string().as_bytes())
                    .unwrap();
                let v: Value =
                    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
                (i, v)
            })
        })
        .collect();
    for h in handles {
        let (i, v) = h.join().unwrap();
        assert_eq!(v["output_ids"], items[i % 2]["output_ids"]);
    }
}

#[test]
fn text_prompts_and_streaming() {
    let srv = Srv::start(&[]);
    let (s, out) = srv.post(
        "/generate",
        &json!({"text": "hello world", "sampling_params": {"temperature": 0, "max_new_tokens": 5}}),
    );
    assert_eq!(s, 200, "{out}");
    assert!(out["meta_info"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(out["text"].is_string());
    let mut body = greedy(&PROMPT, 7);
    body["stream"] = json!(true);
    body["sampling_params"]["stream_interval"] = json!(2);
    let frames = srv.stream("/generate", &body);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let frames: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect();
    assert!(frames.len() >= 2, "incremental: {frames:?}");
    let last = frames.last().unwrap();
    let (_, whole) = srv.post("/generate", &greedy(&PROMPT, 7));
    assert_eq!(last["output_ids"], whole["output_ids"]);
    // Chunks re-prefill what was generated: logprobs equal to rounding.
    close(
        &triple_lps(&last["meta_info"]["output_token_logprobs"]),
        &triple_lps(&whole["meta_info"]["output_token_logprobs"]),
        1e-5,
    );
    assert!(frames[0]["meta_info"]["finish_reason"].is_null());
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
}

#[test]
fn bad_requests_get_sglang_error_shapes() {
    let srv = Srv::start(&[]);
    let (s, v) = srv.post(
        "/generate",
        &json!({"input_ids": PROMPT, "sampling_params": {"bogus": 1}}),
    );
    assert_eq!(s, 400);
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("unknown field `bogus`"), "{msg}");
    let (s, text) = srv.raw("/generate", "{not json", &[]);
    assert_eq!(s, 400);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["object"], "error");
    assert_eq!(v["type"], "Bad Request");
    assert_eq!(v["code"], 400);
    assert!(v["param"].is_null() && v["message"].is_string(), "{v}");
    let (s, v) = srv.post("/generate", &json!({"sampling_params": {}}));
    assert_eq!(s, 400);
    assert!(v["error"]["message"].is_string(), "{v}");
    let (s, v) = srv.post(
        "/generate",
        &json!({"input_ids": PROMPT, "sampling_params": {"frequency_penalty": 0.5}}),
    );
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("frequency_penalty")
    );
    let (s, v) = srv.post("/generate", &json!({"input_ids": [1, 999999]}));
    assert_eq!(s, 400, "{v}");
    // The server is still serving.
    assert_eq!(srv.post("/generate", &greedy(&PROMPT, 2)).0, 200);
    assert_eq!(srv.get("/no_such_route").0, 404);
}

#[test]
fn api_key_guards_every_route_but_health() {
    let srv = Srv::start(&["--api-key", "sekret"]);
    assert_eq!(srv.get("/health").0, 200);
    assert_eq!(srv.get("/health_generate").0, 200);
    let (s, v) = srv.post("/generate", &greedy(&PROMPT, 2));
    assert_eq!((s, v), (401, json!({"error": "Unauthorized"})));
    assert_eq!(srv.get("/model_info").0, 401);
    let auth = [("authorization", "Bearer sekret")];
    let (s, _) = srv.raw("/generate", &greedy(&PROMPT, 2).to_string(), &auth);
    assert_eq!(s, 200);
    let (s, _) = srv.raw(
        "/generate",
        &greedy(&PROMPT, 2).to_string(),
        &[("authorization", "Bearer wrong")],
    );
    assert_eq!(s, 401);
}

#[test]
fn input_logprobs_from_logprob_start_len_equal_tandem_generate_score() {
    let srv = Srv::start(&[]);
    let reference = tandem_generate(&models().0, &PROMPT, 12);
    let mut ids: Vec<Value> = PROMPT.iter().map(|&t| json!(t)).collect();
    ids.extend(reference["tokens"].as_array().unwrap().iter().cloned());
    let body = json!({"input_ids": [ids], "return_logprob": true, "logprob_start_len": 0,
                      "sampling_params": {"temperature": 0, "max_new_tokens": 0}});
    let (s, out) = srv.post("/generate", &body);
    assert_eq!(s, 200, "{out}");
    let input = out[0]["meta_info"]["input_token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(input.len(), ids.len());
    assert!(
        input[0][0].is_null(),
        "the first token has no logprob: {:?}",
        input[0]
    );
    let got: Vec<Value> = input.iter().map(|t| t[1].clone()).collect();
    assert_eq!(got, ids);
    let lps: Vec<f32> = input[1..]
        .iter()
        .map(|t| t[0].as_f64().unwrap() as f32)
        .collect();
    close(&lps, &f32s(&reference["score"]), 1e-5);
}
