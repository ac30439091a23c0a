//! Request bodies for `/v1/completions` (token-id prompts) and the parsing of its answers into
//! ABI completions and per-token scores.

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{Completion, FinishReason, GenerateRequest, PluginError, RVec};

fn bad(what: &str) -> PluginError {
    PluginError::runtime(format!(
        "engine `vllm`: /v1/completions answer has no {what}"
    ))
}

/// Body of a generation request: prompts as token-id lists, output token ids returned, the
/// sampled token's raw logprob (`logprobs: 0`), EOS ignored so only `stop_token_ids` stop
/// (the ABI's contract), and the model's generation config overridden field by field.
pub fn completion_body(model: &str, request: &GenerateRequest) -> Value {
    let s = &request.sampling;
    let prompts: Vec<Vec<u32>> = request.prompts.iter().map(|p| p.to_vec()).collect();
    let mut body = json!({
        "model": model,
        "prompt": prompts,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": if s.top_k == 0 { -1 } else { i64::from(s.top_k) },
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "stop_token_ids": s.stop_token_ids.to_vec(),
        "ignore_eos": true,
        "return_token_ids": true,
        "skip_special_tokens": false,
    });
    if s.logprobs {
        body["logprobs"] = json!(0);
    }
    // vLLM gives every prompt of a batched request the same `seed`, so identical prompts (a
    // GRPO group) would all get the same sample. The seed is sent only when the prompts are
    // all different; with repeats the server's own sampling randomness is used.
    if let Some(seed) = s.seed.into_option() {
        let mut seen = std::collections::HashSet::new();
        if request.prompts.iter().all(|p| seen.insert(p.as_slice())) {
            body["seed"] = json!(seed);
        }
    }
    body
}

/// The `n` choices of an answer, each with the request position it answers (its `index`,
/// else its own position); a different count is a runtime error with `count_message(got)`.
fn indexed_choices(
    v: &Value,
    n: usize,
    count_message: impl FnOnce(usize) -> String,
) -> Result<Vec<(usize, &Value)>> {
    let choices = v
        .get("choices")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("choices"))?;
    if choices.len() != n {
        return Err(PluginError::runtime(count_message(choices.len())));
    }
    Ok(choices
        .iter()
        .enumerate()
        .map(|(pos, c)| {
            let index = c
                .get("index")
                .and_then(Value::as_u64)
                .map_or(pos, |i| usize::try_from(i).unwrap_or(pos));
            (index, c)
        })
        .collect())
}

/// Parses the choices of a generation answer (ordered by `index`).
pub fn completions(v: &Value, n: usize, logprobs: bool) -> Result<Vec<Completion>> {
    let choices = indexed_choices(v, n, |got| {
        format!("engine `vllm`: asked for {n} completions, got {got}")
    })?;
    let mut out: Vec<Option<Completion>> = vec![None; n];
    for (index, c) in choices {
        let tokens: Vec<u32> = c
            .get("token_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("token_ids (return_token_ids)"))?
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("integer token_ids"))?;
        let lps: Vec<f32> = if logprobs {
            c.pointer("/logprobs/token_logprobs")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("logprobs.token_logprobs"))?
                .iter()
                .map(|x| x.as_f64().map(|x| x as f32))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("numeric token_logprobs"))?
        } else {
            Vec::new()
        };
        if logprobs && lps.len() != tokens.len() {
            return Err(PluginError::runtime(format!(
                "engine `vllm`: {} logprobs for {} tokens",
                lps.len(),
                tokens.len()
            )));
        }
        let finish_reason = match c.get("finish_reason").and_then(Value::as_str) {
            Some("stop") => FinishReason::Stop,
            Some("abort") => FinishReason::Aborted,
            _ => FinishReason::Length,
        };
        let slot = out
            .get_mut(index)
            .ok_or_else(|| bad("valid choice index"))?;
        *slot = Some(Completion::new(tokens, lps, finish_reason));
    }
    out.into_iter()
        .map(|c| c.ok_or_else(|| bad("choice for every prompt")))
        .collect()
}

/// Body of a scoring request: one token generated, logprob of every prompt token.
pub fn score_body(model: &str, sequences: &[RVec<u32>]) -> Value {
    let prompts: Vec<Vec<u32>> = sequences.iter().map(|p| p.to_vec()).collect();
    json!({
        "model": model,
        "prompt": prompts,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
        "ignore_eos": true,
    })
}

/// Logprob of every token after the first of each sequence, from `prompt_logprobs`.
pub fn prompt_logprobs(v: &Value, sequences: &[RVec<u32>]) -> Result<Vec<RVec<f32>>> {
    let choices = indexed_choices(v, sequences.len(), |got| {
        format!(
            "engine `vllm`: scored {} sequences, got {got} answers",
            sequences.len()
        )
    })?;
    let mut out = vec![RVec::new(); sequences.len()];
    for (index, c) in choices {
        let seq = sequences
            .get(index)
            .ok_or_else(|| bad("valid choice index"))?;
        let plp = c
            .get("prompt_logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("prompt_logprobs"))?;
        if plp.len() != seq.len() {
            return Err(PluginError::runtime(format!(
                "engine `vllm`: {} prompt logprobs for a sequence of {} tokens",
                plp.len(),
                seq.len()
            )));
        }
        let mut row = Vec::with_capacity(seq.len().saturating_sub(1));
        for (i, tok) in seq.iter().enumerate().skip(1) {
            let lp = plp[i]
                .get(tok.to_string())
                .and_then(|e| e.get("logprob"))
                .and_then(Value::as_f64)
                .ok_or_else(|| bad(&format!("prompt logprob of token {tok} at {i}")))?;
            row.push(lp as f32);
        }
        if let Some(slot) = out.get_mut(index) {
            *slot = row.into();
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_choices_out_of_order_and_abort() {
        let v = json!({"choices": [
            {"index": 1, "token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "abort"},
            {"index": 0, "token_ids": [3, 4], "logprobs": {"token_logprobs": [-1.0, -2.0]}, "finish_reason": "length"}
        ]});
        let c = completions(&v, 2, true).unwrap();
        assert_eq!(c[0].tokens.as_slice(), &[3, 4]);
        assert_eq!(c[1].finish_reason, FinishReason::Aborted);
        assert!(completions(&v, 3, true).is_err());
    }

    #[test]
    fn prompt_logprobs_pick_the_actual_token() {
        let v = json!({"choices": [{"index": 0, "prompt_logprobs": [
            null,
            {"7": {"logprob": -1.5, "rank": 3}, "2": {"logprob": -0.1, "rank": 1}},
            {"9": {"logprob": -0.25, "rank": 1}}
        ]}]});
        let s = prompt_logprobs(&v, &[RVec::from(vec![1u32, 7, 9])]).unwrap();
        assert_eq!(s[0].as_slice(), &[-1.5, -0.25]);
    }

    #[test]
    fn the_seed_is_dropped_when_prompts_repeat() {
        let req = |prompts: Vec<Vec<u32>>| GenerateRequest {
            prompts: prompts.into_iter().map(RVec::from).collect(),
            sampling: tandem_plugin_api::SamplingParams {
                seed: tandem_plugin_api::ROption::RSome(7),
                ..Default::default()
            },
            adapter: tandem_plugin_api::ROption::RNone,
        };
        let distinct = completion_body("m", &req(vec![vec![1, 2], vec![1, 3]]));
        assert_eq!(distinct["seed"], json!(7));
        let group = completion_body("m", &req(vec![vec![1, 2], vec![1, 2]]));
        assert!(group.get("seed").is_none(), "{group}");
    }
}
