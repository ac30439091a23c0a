//! Serving: the generation gate and its in-flight count (what `PauseMode::Wait` waits for),
//! `health` from `/health_generate` and the server's own `/model_info` weight version,
//! `generate` and `score` through `/generate`.

use std::sync::PoisonError;
use std::time::Duration;

use tandem_plugin_api::lifecycle::EngineState;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{
    EngineHealth, ErrorCode, GenerateRequest, GenerateResponse, PluginError, RVec,
};

use super::calls::Deadline;
use super::{SglangEngine, lock};
use crate::http::CallError;
use crate::response;

/// One generate or score call in flight; dropping it wakes a waiting pause.
pub(super) struct InFlight<'a>(&'a SglangEngine);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut n = lock(&self.0.inflight);
        *n = n.saturating_sub(1);
        self.0.idle.notify_all();
    }
}

impl SglangEngine {
    /// Admits a generation call: only while Serving. The count goes up under the state lock,
    /// so a pause (which moves the machine under the same lock) sees every admitted call.
    fn begin(&self) -> Result<InFlight<'_>> {
        let st = lock(&self.state);
        if !st.machine.can_generate() {
            return Err(PluginError::invalid_state(format!(
                "engine `sglang` is {}, not serving; call continue_generation first",
                st.machine.state()
            )));
        }
        *lock(&self.inflight) += 1;
        Ok(InFlight(self))
    }

    /// Waits until no generation call of this engine is in flight.
    pub(super) fn wait_idle(&self, timeout: Duration) -> Result<()> {
        let guard = lock(&self.inflight);
        let (n, _) = self
            .idle
            .wait_timeout_while(guard, timeout, |n| *n > 0)
            .unwrap_or_else(PoisonError::into_inner);
        if *n > 0 {
            return Err(PluginError::new(
                ErrorCode::Timeout,
                format!(
                    "engine `sglang`: pause_generation(wait): {} generate call(s) still running \
                     after {} s",
                    *n,
                    timeout.as_secs()
                ),
            )
            .with_help("raise request_timeout_s, or pause with mode abort"));
        }
        Ok(())
    }

    pub(super) fn server_health(&self) -> Result<EngineHealth> {
        if lock(&self.server).is_none() {
            return Ok(EngineHealth {
                ready: false,
                weight_version: lock(&self.state).version,
                detail: "SGLang server not started".into(),
            });
        }
        // A paused SGLang holds /health_generate's probe request (and marks itself unhealthy
        // after 20 s): it is asked only while serving.
        let serving = lock(&self.state).machine.can_generate();
        let mut unhealthy = None;
        if serving {
            match self.get_raw("/health_generate")? {
                Ok(_) => {}
                Err(CallError::Status(code, m)) => {
                    unhealthy = Some(format!("GET /health_generate answered {code} {m}"));
                }
                Err(e) => return Err(self.call_error(e, "GET /health_generate")),
            }
        }
        let served = self.served_version()?;
        let base = self.client()?.base().to_owned();
        let st = lock(&self.state);
        if served != st.version && !matches!(st.machine.state(), EngineState::Updating { .. }) {
            return Err(PluginError::new(
                ErrorCode::Corrupt,
                format!(
                    "engine `sglang`: GET /model_info: the server at {base} serves weight \
                     version {served}, the engine applied version {}",
                    st.version
                ),
            )
            .with_help("something else updated the server's weights; restart the run"));
        }
        let mut detail = format!(
            "{} at {base}",
            st.machine.state().to_string().to_lowercase()
        );
        if let Some(u) = &unhealthy {
            detail = format!("{detail}: {u}");
        }
        Ok(EngineHealth {
            ready: serving && unhealthy.is_none(),
            weight_version: served,
            detail: detail.into(),
        })
    }

    pub(super) fn complete(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        if request.sampling.return_hidden_states {
            return Err(PluginError::not_supported(
                "generate with return_hidden_states",
                "sglang",
            ));
        }
        let _inflight = self.begin()?;
        if request.prompts.iter().any(|p| p.is_empty()) {
            return Err(PluginError::invalid_input(
                "engine `sglang`: generate: a prompt is empty",
            ));
        }
        let (adapter, version) = {
            let st = lock(&self.state);
            let adapter = request
                .adapter
                .as_ref()
                .map(|a| a.to_string())
                .into_option()
                .or_else(|| st.active_adapter.clone());
            (adapter, st.version)
        };
        if request.prompts.is_empty() {
            return Ok(GenerateResponse {
                completions: RVec::new(),
                weight_version: version,
            });
        }
        let body = response::generate_body(&request, adapter.as_deref());
        let v = self.post_json("/generate", &body, Deadline::Request)?;
        let completions =
            response::completions(&v, request.prompts.len(), request.sampling.logprobs)?;
        Ok(GenerateResponse {
            completions: completions.into(),
            weight_version: version,
        })
    }

    pub(super) fn score_sequences(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        let _inflight = self.begin()?;
        if sequences.iter().any(|s| s.is_empty()) {
            return Err(PluginError::invalid_input(
                "engine `sglang`: score: a sequence is empty",
            ));
        }
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let adapter = lock(&self.state).active_adapter.clone();
        let body = response::score_body(&sequences, adapter.as_deref());
        let v = self.post_json("/generate", &body, Deadline::Request)?;
        response::scores(&v, &sequences)
    }
}
