//! Request bodies for SGLang's `/generate` (token ids in, token ids and logprobs out; scoring
//! through `input_token_logprobs`) and the parsing of its answers and of the control routes'
//! answers (`{"success", "message"}`, `/model_info`, `/weights_checker`) into ABI values.
//! Every shape that is not the documented one is an error naming the route and the field.

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{Completion, ErrorCode, FinishReason, GenerateRequest, PluginError, RVec};

/// The error for an answer of `route` that lacks `what`.
pub fn unexpected(route: &str, what: &str) -> PluginError {
    crate::engine::DIALECT.unexpected(route, what).with_help(
        "the server does not answer like SGLang 0.5.23; set trace_requests in [engine] options \
         to record the exchange",
    )
}

/// Body of a generation request: token-id prompts as a batch, SGLang's sampling keys only
/// (unknown keys are a 400), the sampled token's logprob, EOS ignored so only
/// `stop_token_ids` stop (the ABI's contract) and the stop token kept in `output_ids`.
pub fn generate_body(request: &GenerateRequest, adapter: Option<&str>) -> Value {
    let s = &request.sampling;
    let prompts: Vec<Vec<u32>> = request.prompts.iter().map(|p| p.to_vec()).collect();
    let mut sampling = json!({
        "max_new_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "stop_token_ids": s.stop_token_ids.to_vec(),
        "ignore_eos": true,
        "no_stop_trim": true,
        "skip_special_tokens": false,
    });
    if s.top_k > 0 {
        sampling["top_k"] = json!(s.top_k);
    }
    // One seed per prompt: SGLang seeds each request of a batch with its own `sampling_seed`,
    // so one shared seed would give identical prompts (a GRPO group) identical samples. The
    // seeds stay within SGLang's int64.
    let sampling = match s.seed.into_option() {
        None => sampling,
        Some(seed) => Value::Array(
            (0..prompts.len() as u64)
                .map(|i| {
                    let mut p = sampling.clone();
                    p["sampling_seed"] = json!(seed.wrapping_add(i) & (i64::MAX as u64));
                    p
                })
                .collect(),
        ),
    };
    let mut body = json!({
        "input_ids": prompts,
        "sampling_params": sampling,
        "return_logprob": true,
    });
    if let Some(a) = adapter {
        body["lora_path"] = json!(a);
    }
    body
}

fn items<'a>(v: &'a Value, route: &str, n: usize) -> Result<&'a Vec<Value>> {
    let list = v
        .as_array()
        .ok_or_else(|| unexpected(route, "not a list (one object per prompt)"))?;
    if list.len() != n {
        return Err(unexpected(
            route,
            &format!("{} answers for {n} prompts", list.len()),
        ));
    }
    Ok(list)
}

fn token_id(x: &Value) -> Option<u32> {
    x.as_u64().and_then(|t| u32::try_from(t).ok())
}

/// `[logprob, token_id, text|null]` triples → (logprob or `None`, token id).
fn triples(v: &Value, route: &str, field: &str) -> Result<Vec<(Option<f32>, u32)>> {
    let list = v
        .pointer(&format!("/meta_info/{field}"))
        .and_then(Value::as_array)
        .ok_or_else(|| unexpected(route, &format!("no meta_info.{field}")))?;
    list.iter()
        .map(|t| {
            let lp = t.get(0)?;
            let lp = if lp.is_null() {
                None
            } else {
                Some(lp.as_f64()? as f32)
            };
            Some((lp, token_id(t.get(1)?)?))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            unexpected(
                route,
                &format!("meta_info.{field} is not a list of [logprob, token_id, text]"),
            )
        })
}

/// SGLang's `finish_reason` object → the ABI's reason.
pub fn finish_reason(v: &Value, route: &str) -> Result<FinishReason> {
    let fr = v
        .pointer("/meta_info/finish_reason")
        .ok_or_else(|| unexpected(route, "no meta_info.finish_reason"))?;
    match fr.get("type").and_then(Value::as_str) {
        Some("stop") => Ok(FinishReason::Stop),
        Some("length") => Ok(FinishReason::Length),
        Some("abort") => Ok(FinishReason::Aborted),
        _ => Err(unexpected(
            route,
            &format!("meta_info.finish_reason {fr} is not stop, length or abort"),
        )),
    }
}

/// Parses the answers of a `/generate` batch of `n` prompts.
pub fn completions(v: &Value, n: usize, logprobs: bool) -> Result<Vec<Completion>> {
    const ROUTE: &str = "POST /generate";
    let mut out = Vec::with_capacity(n);
    for item in items(v, ROUTE, n)? {
        let lps = triples(item, ROUTE, "output_token_logprobs")?;
        let tokens: Vec<u32> = match item.get("output_ids") {
            Some(ids) => ids
                .as_array()
                .and_then(|a| a.iter().map(token_id).collect::<Option<Vec<_>>>())
                .ok_or_else(|| unexpected(ROUTE, "output_ids is not a list of token ids"))?,
            None => lps.iter().map(|(_, t)| *t).collect(),
        };
        if lps.len() != tokens.len() || lps.iter().zip(&tokens).any(|((_, a), b)| a != b) {
            return Err(unexpected(
                ROUTE,
                &format!(
                    "output_ids {tokens:?} differ from the tokens of output_token_logprobs {:?}",
                    lps.iter().map(|(_, t)| *t).collect::<Vec<_>>()
                ),
            ));
        }
        let lps: Vec<f32> = if logprobs {
            lps.iter()
                .map(|(lp, _)| *lp)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| unexpected(ROUTE, "a null logprob of a generated token"))?
        } else {
            Vec::new()
        };
        out.push(Completion::new(tokens, lps, finish_reason(item, ROUTE)?));
    }
    Ok(out)
}

/// Body of a scoring request: no new token, the logprob of every prompt token from the first.
pub fn score_body(sequences: &[RVec<u32>], adapter: Option<&str>) -> Value {
    let prompts: Vec<Vec<u32>> = sequences.iter().map(|p| p.to_vec()).collect();
    let mut body = json!({
        "input_ids": prompts,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": true,
        "logprob_start_len": 0,
    });
    if let Some(a) = adapter {
        body["lora_path"] = json!(a);
    }
    body
}

/// The logprob of every token after the first of each sequence (`input_token_logprobs`,
/// whose first entry has no logprob).
pub fn scores(v: &Value, sequences: &[RVec<u32>]) -> Result<Vec<RVec<f32>>> {
    const ROUTE: &str = "POST /generate (score)";
    let mut out = Vec::with_capacity(sequences.len());
    for (item, seq) in items(v, ROUTE, sequences.len())?.iter().zip(sequences) {
        let lps = triples(item, ROUTE, "input_token_logprobs")?;
        let ids: Vec<u32> = lps.iter().map(|(_, t)| *t).collect();
        if ids != seq.as_slice() {
            return Err(unexpected(
                ROUTE,
                &format!(
                    "input_token_logprobs cover tokens {ids:?}, not the sequence {:?}",
                    seq.as_slice()
                ),
            ));
        }
        let row = lps
            .iter()
            .skip(1)
            .map(|(lp, _)| *lp)
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| unexpected(ROUTE, "a null logprob after the first input token"))?;
        out.push(row.into());
    }
    Ok(out)
}

/// A Tandem version from SGLang's `weight_version` label: the decimal version, or
/// SGLang's initial `"default"` = 0.
pub fn parse_version(label: &str) -> Option<u64> {
    if label == "default" {
        return Some(0);
    }
    label.parse().ok()
}

/// The served version from a `/model_info` answer.
pub fn model_info_version(v: &Value) -> Result<u64> {
    const ROUTE: &str = "GET /model_info";
    let label = v
        .get("weight_version")
        .and_then(Value::as_str)
        .ok_or_else(|| unexpected(ROUTE, "no weight_version string"))?;
    parse_version(label).ok_or_else(|| {
        PluginError::new(
            ErrorCode::InvalidState,
            format!(
                "engine `sglang`: {ROUTE}: the server serves weight version `{label}`, not a \
                 Tandem version (a decimal number)"
            ),
        )
        .with_help("start the server with --weight-version 0 (or the version it serves)")
    })
}

/// Checks a `{"success": bool, "message"|"error_message": str}` answer of `route`.
pub fn success(v: &Value, route: &str) -> Result<()> {
    match v.get("success").and_then(Value::as_bool) {
        Some(true) => Ok(()),
        Some(false) => {
            let msg = v
                .get("message")
                .or_else(|| v.get("error_message"))
                .and_then(Value::as_str)
                .unwrap_or("no message");
            Err(PluginError::runtime(format!(
                "engine `sglang`: {route}: the server refused: {msg}"
            ))
            .with_help("read the server's message and log"))
        }
        None => Err(unexpected(route, &format!("no `success` in {v}"))),
    }
}

/// The weight digest of a `/weights_checker {"action":"checksum"}` answer: `checksum`
/// (tandem serve's extension) when present; real SGLang answers none.
pub fn checksum(v: &Value) -> Result<Option<String>> {
    success(v, "POST /weights_checker")?;
    Ok(v.get("checksum").and_then(Value::as_str).map(str::to_owned))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tandem_plugin_support::quote::error_message;

    #[test]
    fn quotes_each_sglang_error_shape_on_one_line() {
        assert_eq!(
            error_message(r#"{"error": {"message": "LoRA is\n not enabled"}}"#),
            "LoRA is not enabled"
        );
        assert_eq!(
            error_message(r#"{"error": "unknown field `foo`"}"#),
            "unknown field `foo`"
        );
        assert_eq!(
            error_message(
                r#"{"object":"error","message":"bad","type":"Bad Request","param":null,"code":400}"#
            ),
            "bad"
        );
        assert_eq!(
            error_message(
                r#"{"success": false, "error_message": "no such adapter", "loaded_adapters": {}}"#
            ),
            "no such adapter"
        );
        assert_eq!(
            error_message("Cache not flushed: requests running\n"),
            "Cache not flushed: requests running"
        );
    }
    use tandem_plugin_api::{ROption, SamplingParams};

    fn request(prompts: Vec<Vec<u32>>, top_k: u32, seed: Option<u64>) -> GenerateRequest {
        GenerateRequest {
            prompts: prompts.into_iter().map(RVec::from).collect(),
            sampling: SamplingParams {
                top_k,
                seed: seed.into(),
                stop_token_ids: vec![2u32].into(),
                ..Default::default()
            },
            adapter: ROption::RNone,
        }
    }

    #[test]
    fn the_body_uses_sglang_keys_only() {
        let b = generate_body(&request(vec![vec![1, 2]], 0, None), None);
        let sp = b["sampling_params"].as_object().unwrap();
        let mut keys: Vec<&str> = sp.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "ignore_eos",
                "max_new_tokens",
                "no_stop_trim",
                "skip_special_tokens",
                "stop_token_ids",
                "temperature",
                "top_p"
            ]
        );
        assert_eq!(b["input_ids"], json!([[1, 2]]));
        assert_eq!(b["return_logprob"], json!(true));
        assert!(b.get("lora_path").is_none());
        let b = generate_body(
            &request(vec![vec![1], vec![1]], 5, Some(u64::MAX)),
            Some("v3"),
        );
        // A seed per prompt (a group of equal prompts gets different samples), within int64.
        assert_eq!(b["sampling_params"][0]["top_k"], json!(5));
        assert_eq!(b["sampling_params"][0]["sampling_seed"], json!(i64::MAX));
        assert_eq!(b["sampling_params"][1]["sampling_seed"], json!(0));
        assert_eq!(b["lora_path"], json!("v3"));
    }

    /// Two answers shaped as SGLang 0.5.23 returns them (`tokenizer_manager.py`: text,
    /// output_ids, meta_info with positional triples and a finish_reason object).
    fn answer() -> Value {
        json!([
            {"text": "ab", "output_ids": [7, 2], "meta_info": {
                "id": "r1", "finish_reason": {"type": "stop", "matched": 2},
                "prompt_tokens": 2, "completion_tokens": 2, "cached_tokens": 0,
                "weight_version": "3", "num_retractions": 0, "e2e_latency": 0.1,
                "output_token_logprobs": [[-0.5, 7, null], [-1.25, 2, null]],
                "output_token_logprobs_length": 2}},
            {"text": "c", "output_ids": [9], "meta_info": {
                "id": "r2", "finish_reason": {"type": "length", "length": 1},
                "output_token_logprobs": [[-0.75, 9, null]]}}
        ])
    }

    #[test]
    fn parses_tokens_logprobs_and_finish_reasons() {
        let c = completions(&answer(), 2, true).unwrap();
        assert_eq!(c[0].tokens.as_slice(), &[7, 2]);
        assert_eq!(c[0].logprobs.as_slice(), &[-0.5, -1.25]);
        assert_eq!(c[0].finish_reason, FinishReason::Stop);
        assert_eq!(c[1].finish_reason, FinishReason::Length);
        assert!(
            completions(&answer(), 2, false).unwrap()[0]
                .logprobs
                .is_empty()
        );
        let abort = json!([{"output_ids": [], "meta_info": {
            "finish_reason": {"type": "abort", "message": "Abort before prefill"},
            "output_token_logprobs": []}}]);
        assert_eq!(
            completions(&abort, 1, true).unwrap()[0].finish_reason,
            FinishReason::Aborted
        );
    }

    #[test]
    fn unknown_shapes_are_one_line_naming_the_field() {
        let e = completions(&answer(), 3, true).unwrap_err();
        assert!(e.message.contains("2 answers for 3 prompts"), "{e}");
        let e = completions(&json!({"error": "x"}), 1, true).unwrap_err();
        assert!(
            e.message.contains("POST /generate: unexpected answer"),
            "{e}"
        );
        let bad = json!([{"output_ids": [1], "meta_info": {"finish_reason": {"type": "stop"},
            "output_token_logprobs": [{"logprob": -1.0, "token_id": 1}]}}]);
        let e = completions(&bad, 1, true).unwrap_err();
        assert!(e.message.contains("[logprob, token_id, text]"), "{e}");
        let odd = json!([{"output_ids": [1], "meta_info": {"finish_reason": {"type": "eos"},
            "output_token_logprobs": [[-1.0, 1, null]]}}]);
        assert!(
            completions(&odd, 1, true)
                .unwrap_err()
                .message
                .contains("eos")
        );
        let mismatch = json!([{"output_ids": [1, 2], "meta_info": {
            "finish_reason": {"type": "length", "length": 1},
            "output_token_logprobs": [[-1.0, 1, null]]}}]);
        assert!(completions(&mismatch, 1, true).is_err());
    }

    #[test]
    fn scores_skip_the_first_input_token() {
        let seq = [RVec::from(vec![5u32, 6, 7])];
        let b = score_body(&seq, None);
        assert_eq!(b["sampling_params"]["max_new_tokens"], json!(0));
        assert_eq!(b["logprob_start_len"], json!(0));
        let v = json!([{"text": "", "output_ids": [], "meta_info": {
            "finish_reason": {"type": "length", "length": 0},
            "input_token_logprobs": [[null, 5, null], [-2.0, 6, null], [-0.5, 7, null]],
            "output_token_logprobs": []}}]);
        assert_eq!(scores(&v, &seq).unwrap()[0].as_slice(), &[-2.0, -0.5]);
        let short = json!([{"meta_info": {"input_token_logprobs": [[null, 5, null]]}}]);
        assert!(
            scores(&short, &seq)
                .unwrap_err()
                .message
                .contains("not the sequence")
        );
    }

    #[test]
    fn versions_and_control_answers() {
        assert_eq!(parse_version("default"), Some(0));
        assert_eq!(parse_version("12"), Some(12));
        assert_eq!(parse_version("step-3"), None);
        let info = json!({"model_path": "/m", "weight_version": "4", "is_generation": true});
        assert_eq!(model_info_version(&info).unwrap(), 4);
        let e = model_info_version(&json!({"weight_version": "rl-step"})).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidState);
        success(
            &json!({"success": true, "message": "ok", "num_paused_requests": 0}),
            "r",
        )
        .unwrap();
        let e = success(&json!({"success": false, "message": "bad dir"}), "POST /x").unwrap_err();
        assert!(
            e.message.contains("POST /x: the server refused: bad dir"),
            "{e}"
        );
        let lora = json!({"rid": null, "http_worker_ipc": null, "success": false,
            "error_message": "LoRA is not enabled", "loaded_adapters": {}});
        assert!(
            success(&lora, "r")
                .unwrap_err()
                .message
                .contains("LoRA is not enabled")
        );
        assert!(success(&json!(null), "r").is_err());
        assert_eq!(
            checksum(&json!({"success": true, "message": ""})).unwrap(),
            None
        );
        assert_eq!(
            checksum(&json!({"success": true, "message": "", "checksum": "w64:3:ab"}))
                .unwrap()
                .as_deref(),
            Some("w64:3:ab")
        );
    }
}
