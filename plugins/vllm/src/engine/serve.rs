//! Serving: the generation gate, `health` from the server's own weight version, `generate`
//! and `score` through `/v1/completions`.

use serde_json::Value;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{EngineHealth, GenerateRequest, GenerateResponse, PluginError, RVec};

use super::{VllmEngine, lock};
use crate::options::SERVED_NAME;
use crate::response;

impl VllmEngine {
    fn begin(&self) -> Result<()> {
        let st = lock(&self.state);
        if !st.machine.can_generate() {
            return Err(PluginError::invalid_state(format!(
                "engine `vllm` is {}, not serving; call continue_generation first",
                st.machine.state()
            )));
        }
        Ok(())
    }
    pub(super) fn server_health(&self) -> Result<EngineHealth> {
        let started = lock(&self.server).is_some();
        if !started {
            return Ok(EngineHealth {
                ready: false,
                weight_version: lock(&self.state).version,
                detail: "vLLM server not started".into(),
            });
        }
        let client = self.client()?;
        let info = client
            .get("/weight_info", self.opts.control_timeout())
            .map_err(|e| self.call_error(e, "GET /weight_info"))?;
        let reported = serde_json::from_str::<Value>(&info)
            .ok()
            .and_then(|v| v.get("weight_version")?.as_str()?.parse::<u64>().ok());
        let st = lock(&self.state);
        let Some(version) = reported else {
            return Err(PluginError::runtime(format!(
                "engine `vllm`: the server reports weight version {info}, not a Tandem version"
            )));
        };
        Ok(EngineHealth {
            ready: st.machine.can_generate(),
            weight_version: version,
            detail: format!(
                "{} at {} serving {} (log {})",
                st.machine.state().to_string().to_lowercase(),
                client.base(),
                st.served_dir.display(),
                self.log.display()
            )
            .into(),
        })
    }
    pub(super) fn complete(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        if request.sampling.return_hidden_states {
            return Err(PluginError::not_supported(
                "generate with return_hidden_states",
                "vllm",
            ));
        }
        self.begin()?;
        if request.prompts.iter().any(|p| p.is_empty()) {
            return Err(PluginError::invalid_input(
                "engine `vllm`: generate: a prompt is empty",
            ));
        }
        let (model, version) = {
            let st = lock(&self.state);
            let model = request
                .adapter
                .as_ref()
                .map(|a| a.to_string())
                .into_option()
                .or_else(|| st.active_adapter.clone())
                .unwrap_or_else(|| SERVED_NAME.to_owned());
            (model, st.version)
        };
        if request.prompts.is_empty() {
            return Ok(GenerateResponse {
                completions: RVec::new(),
                weight_version: version,
            });
        }
        let body = response::completion_body(&model, &request);
        let v = self.post_json("/v1/completions", &body, false)?;
        let completions =
            response::completions(&v, request.prompts.len(), request.sampling.logprobs)?;
        Ok(GenerateResponse {
            completions: completions.into(),
            weight_version: version,
        })
    }

    pub(super) fn score_sequences(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        self.begin()?;
        if sequences.iter().any(|s| s.is_empty()) {
            return Err(PluginError::invalid_input(
                "engine `vllm`: score: a sequence is empty",
            ));
        }
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let model = lock(&self.state)
            .active_adapter
            .clone()
            .unwrap_or_else(|| SERVED_NAME.to_owned());
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
            let body = response::score_body(&model, chunk);
            let v = self.post_json("/v1/completions", &body, false)?;
            out.extend(response::prompt_logprobs(&v, chunk)?);
        }
        Ok(out)
    }
}
