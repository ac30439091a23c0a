//! OpenAI's routes on `tandem serve`: completions and chat (logprobs equal the engine's),
//! the chat template, streaming, models, errors.

use super::{PROMPT, Srv, f32s, models, tandem_generate};
use serde_json::{Value, json};

fn data(frames: &[String]) -> Vec<Value> {
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect()
}

#[test]
fn completions_with_logprobs_equal_the_engine() {
    let srv = Srv::start(&[]);
    let body = json!({"model": "m", "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                      "logprobs": 1, "return_token_ids": true});
    let (s, v) = srv.post("/v1/completions", &body);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let reference = tandem_generate(&models().0, &PROMPT, 8);
    let c = &v["choices"][0];
    assert_eq!(c["token_ids"], reference["tokens"]);
    assert_eq!(c["prompt_token_ids"], json!(PROMPT));
    let lp = &c["logprobs"];
    assert_eq!(f32s(&lp["token_logprobs"]), f32s(&reference["logprobs"]));
    let n = reference["tokens"].as_array().unwrap().len();
    for key in ["tokens", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().unwrap().len(), n, "{key}");
    }
    assert_eq!(lp["text_offset"][0], 0);
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert_eq!(top.values().next().unwrap(), &lp["token_logprobs"][0]);
    assert_eq!(c["finish_reason"], reference["finish_reason"]);
    assert_eq!(v["usage"]["prompt_tokens"], PROMPT.len());
    assert_eq!(v["usage"]["completion_tokens"], n);
}

#[test]
fn chat_uses_the_template_and_reports_logprobs() {
    let srv = Srv::start(&[]);
    let body = json!({"model": "m", "max_tokens": 6, "temperature": 0, "logprobs": true,
        "top_logprobs": 1, "return_prompt_token_ids": true, "return_token_ids": true,
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    let (s, v) = srv.post("/v1/chat/completions", &body);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    let tk = tokenizers::Tokenizer::from_file(models().0.join("tokenizer.json")).unwrap();
    let rendered = "<system>be brief\n<user>hi\n<assistant>";
    let ids = tk.encode(rendered, false).unwrap().get_ids().to_vec();
    assert_eq!(c["prompt_token_ids"], json!(ids));
    let reference = tandem_generate(&models().0, &ids, 6);
    assert_eq!(c["response_token_ids"], reference["tokens"]);
    let content = c["logprobs"]["content"].as_array().unwrap();
    let lps: Vec<Value> = content.iter().map(|e| e["logprob"].clone()).collect();
    assert_eq!(f32s(&Value::Array(lps)), f32s(&reference["logprobs"]));
    for e in content {
        let token = e["token"].as_str().unwrap();
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, token.as_bytes());
        assert_eq!(e["top_logprobs"][0]["logprob"], e["logprob"]);
    }
}

#[test]
fn streaming_completions_and_chat() {
    let srv = Srv::start(&[]);
    let body = json!({"model": "m", "prompt": PROMPT, "max_tokens": 9, "temperature": 0});
    let (_, whole) = srv.post("/v1/completions", &body);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    sbody["stream_interval"] = json!(3);
    let frames = data(&srv.stream("/v1/completions", &sbody));
    let usage = frames.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 9);
    let chunks = &frames[..frames.len() - 1];
    assert!(chunks.len() >= 3, "{chunks:?}");
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    assert!(chunks[0]["choices"][0]["finish_reason"].is_null());
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let chat = json!({"model": "m", "max_tokens": 4, "temperature": 0, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let frames = data(&srv.stream("/v1/chat/completions", &chat));
    assert_eq!(frames[0]["object"], "chat.completion.chunk");
    assert_eq!(frames[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        frames.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn models_and_openai_errors() {
    let srv = Srv::start(&["--served-model-name", "tiny"]);
    let (s, v) = srv.get("/v1/models");
    assert_eq!(s, 200);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "tiny");
    let (s, text) = srv.raw("/v1/completions", "[1,", &[]);
    assert_eq!(s, 400);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["object"], "error");
    assert_eq!(v["code"], 400);
    assert!(v["message"].is_string() && v["type"].is_string() && v["param"].is_null());
    let (s, v) = srv.post("/v1/chat/completions", &json!({"model": "tiny"}));
    assert_eq!((s, &v["object"]), (400, &json!("error")), "{v}");
    let (s, v) = srv.post(
        "/v1/completions",
        &json!({"prompt": "x", "presence_penalty": 1.0}),
    );
    assert_eq!(s, 400, "{v}");
}

/// A random LoRA adapter of the tiny model in `dir` (PEFT layout, written by the core).
fn adapter(dir: &std::path::Path) {
    use tandem_native_core::buffer::VecProvider;
    use tandem_native_core::config::ModelConfig;
    use tandem_native_core::lora::{ALL_TARGETS, LoraAdapter, LoraConfig};
    let cfg = ModelConfig::from_dir(&models().0).unwrap();
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        targets: ALL_TARGETS.to_vec(),
        base_model: "tiny".into(),
    };
    let mut ad = LoraAdapter::new(&cfg, lora, &mut VecProvider::new()).unwrap();
    for (i, x) in ad.weights.as_mut_slice().iter_mut().enumerate() {
        *x = (((i * 7919) % 1000) as f32 / 1000.0 - 0.5) * 0.4;
    }
    ad.save(dir).unwrap();
}

#[test]
fn an_adapter_given_at_start_serves_requests_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("my-adapter");
    adapter(&dir);
    let ids: Vec<String> = PROMPT.iter().map(u32::to_string).collect();
    let o = crate::common::run(
        crate::common::tandem()
            .args([
                "generate",
                "--json",
                "--greedy",
                "--max-tokens",
                "6",
                "--model",
            ])
            .arg(&models().0)
            .args(["--prompt-ids", &ids.join(","), "--adapter"])
            .arg(&dir),
    );
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let reference: Value = serde_json::from_slice(&o.stdout).unwrap();
    let srv = Srv::start(&["--adapter", dir.to_str().unwrap()]);
    let (_, v) = srv.get("/v1/models");
    assert_eq!(v["data"][1]["id"], "my-adapter", "{v}");
    let body = json!({"model": "my-adapter", "prompt": PROMPT, "max_tokens": 6,
                      "temperature": 0, "logprobs": 0, "return_token_ids": true});
    let (s, v) = srv.post("/v1/completions", &body);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["token_ids"], reference["tokens"]);
    let lps = &v["choices"][0]["logprobs"]["token_logprobs"];
    assert_eq!(f32s(lps), f32s(&reference["logprobs"]));
    let mut native = super::greedy(&PROMPT, 6);
    native["lora_path"] = json!("my-adapter");
    let (_, out) = srv.post("/generate", &native);
    assert_eq!(out["output_ids"], reference["tokens"]);
    let base = tandem_generate(&models().0, &PROMPT, 6);
    let (_, plain) = srv.post("/generate", &super::greedy(&PROMPT, 6));
    assert_eq!(
        plain["output_ids"], base["tokens"],
        "no adapter named: the base model"
    );
    // Unload, then the name is unknown; load it again under another name.
    let (s, v) = srv.post("/unload_lora_adapter", &json!({"lora_name": "my-adapter"}));
    assert_eq!((s, &v["loaded_adapters"]), (200, &json!({})), "{v}");
    assert_eq!(srv.post("/generate", &native).0, 400);
    let body = json!({"lora_name": "again", "lora_path": dir});
    let (s, v) = srv.post("/load_lora_adapter", &body);
    assert_eq!((s, &v["success"]), (200, &json!(true)), "{v}");
    assert!(v["loaded_adapters"]["again"].is_string());
}
