//! Generation and scoring through `/v1/completions`, under the request's adapter, the active
//! one, or the base model's served name.

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{Completion, GenerateRequest, RVec};
use tandem_plugin_support::server_engine::Deadline;

use super::{Vllm, VllmEngine};
use crate::options::SERVED_NAME;
use crate::response;

impl Vllm {
    pub(super) fn complete(
        &self,
        engine: &VllmEngine,
        request: &GenerateRequest,
        adapter: Option<&str>,
    ) -> Result<Vec<Completion>> {
        let body = response::completion_body(adapter.unwrap_or(SERVED_NAME), request);
        let v = engine.post_json("/v1/completions", &body, Deadline::Request)?;
        response::completions(&v, request.prompts.len(), request.sampling.logprobs)
    }

    pub(super) fn prompt_logprobs(
        &self,
        engine: &VllmEngine,
        sequences: &[RVec<u32>],
        adapter: Option<&str>,
    ) -> Result<Vec<RVec<f32>>> {
        let model = adapter.unwrap_or(SERVED_NAME);
        // vLLM 0.32's CPU LoRA logits path (punica_cpu `add_lora_logits`) mis-sizes prompt
        // logprobs of several sequences batched in one step and kills the engine core
        // ("einsum(): subscript b has size 2 ... size 5"), adapter active or not. With LoRA on,
        // each sequence is scored in a request of its own, one after the other.
        let per_request = if self.opts.enable_lora {
            1
        } else {
            sequences.len()
        };
        let mut out = Vec::with_capacity(sequences.len());
        for chunk in sequences.chunks(per_request) {
            let body = response::score_body(model, chunk);
            let v = engine.post_json("/v1/completions", &body, Deadline::Request)?;
            out.extend(response::prompt_logprobs(&v, chunk)?);
        }
        Ok(out)
    }
}
