//! ABI generate requests -> core requests (seeds per prompt, chunks of `max_batch` with the
//! abort flag checked between chunks) and core outputs -> ABI completions.

use tandem_native_core::engine::{self as core, GenRequest};
use tandem_native_core::sampling::SamplingParams;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{
    Completion, FinishReason, GenerateRequest, GenerateResponse, PluginError, RVec,
};

use super::{NativeEngine, lock};
use crate::common::Ctx;

impl NativeEngine {
    pub(super) fn run_generate(&self, request: &GenerateRequest) -> Result<GenerateResponse> {
        let sp = &request.sampling;
        let seed = sp.seed.into_option().unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        // No adapter named: the one the last adapter update switched to (resolved once, so
        // the whole request runs under one adapter).
        let adapter = request
            .adapter
            .as_ref()
            .map(|a| a.to_string())
            .into_option()
            .or_else(|| lock(&self.inner).active_adapter.clone());
        let reqs: Vec<GenRequest> = request
            .prompts
            .iter()
            .enumerate()
            .map(|(i, p)| GenRequest {
                prompt: p.to_vec(),
                max_tokens: sp.max_tokens as usize,
                stop_tokens: sp.stop_token_ids.to_vec(),
                sampling: SamplingParams {
                    temperature: sp.temperature,
                    top_p: sp.top_p,
                    top_k: sp.top_k as usize,
                    // Distinct streams per prompt (a GRPO group repeats one prompt).
                    seed: seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                },
                adapter: adapter.clone(),
            })
            .collect();
        if !(sp.top_p > 0.0 && sp.top_p <= 1.0) || sp.temperature < 0.0 {
            return Err(PluginError::invalid_input(format!(
                "sampling needs 0 < top_p <= 1 and temperature >= 0 (got {}, {})",
                sp.top_p, sp.temperature
            )));
        }
        let mut completions = Vec::with_capacity(reqs.len());
        let mut version = 0;
        let chunk = lock(&self.inner).engine.config().max_batch;
        for part in reqs.chunks(chunk) {
            if self.aborted() {
                completions.extend(part.iter().map(|_| aborted_completion()));
                continue;
            }
            let mut guard = lock(&self.inner);
            let inner = &mut *guard;
            version = inner.weight_version;
            let outs = inner
                .engine
                .generate(part, sp.return_hidden_states, &mut inner.provider)
                .ctx("engine `native` generate")?;
            let d = inner.engine.model.cfg.hidden_size as u32;
            completions.extend(outs.into_iter().map(|o| completion(o, sp.logprobs, d)));
        }
        Ok(GenerateResponse {
            completions: completions.into(),
            weight_version: version,
        })
    }
}

fn aborted_completion() -> Completion {
    Completion {
        tokens: RVec::new(),
        logprobs: RVec::new(),
        finish_reason: FinishReason::Aborted,
        hidden_states: RVec::new(),
        hidden_dim: 0,
    }
}

fn completion(o: core::GenOutput, logprobs: bool, d: u32) -> Completion {
    let hidden = o.hidden.unwrap_or_default();
    Completion {
        tokens: o.tokens.into(),
        logprobs: if logprobs {
            o.logprobs.into()
        } else {
            RVec::new()
        },
        finish_reason: match o.finish {
            core::FinishReason::Stop => FinishReason::Stop,
            core::FinishReason::Length => FinishReason::Length,
        },
        hidden_dim: if hidden.is_empty() { 0 } else { d },
        hidden_states: hidden.into(),
    }
}
