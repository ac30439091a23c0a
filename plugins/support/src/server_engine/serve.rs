//! Serving: generation admission (only while Serving) and the in-flight count that
//! `PauseMode::Wait` can wait for; `generate` and `score` checked and answered here up to the
//! request itself, which is the backend's.

use std::sync::PoisonError;
use std::time::Duration;

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, GenerateRequest, GenerateResponse, PluginError, RVec};

use super::engine::{ServerEngine, lock};
use super::{Backend, Generation, Scoring};

/// One generate or score call in flight; dropping it wakes a waiting pause.
struct InFlight<'a, B: Backend>(&'a ServerEngine<B>);

impl<B: Backend> Drop for InFlight<'_, B> {
    fn drop(&mut self) {
        let mut n = lock(&self.0.inflight);
        *n = n.saturating_sub(1);
        self.0.idle.notify_all();
    }
}

impl<B: Backend> ServerEngine<B> {
    /// Admits a generation call: only while Serving. The count goes up under the state lock,
    /// so a pause (which moves the machine under the same lock) sees every admitted call.
    fn begin(&self) -> Result<InFlight<'_, B>> {
        let st = lock(&self.state);
        if !st.machine.can_generate() {
            return Err(PluginError::invalid_state(format!(
                "engine `{}` is {}, not serving; call continue_generation first",
                B::DIALECT.component,
                st.machine.state()
            )));
        }
        *lock(&self.inflight) += 1;
        Ok(InFlight(self))
    }

    /// Waits until no generate or score call of this engine is in flight (a pause in mode
    /// `wait` on a server that cannot drain by itself).
    pub fn wait_idle(&self, timeout: Duration) -> Result<()> {
        let guard = lock(&self.inflight);
        let (n, _) = self
            .idle
            .wait_timeout_while(guard, timeout, |n| *n > 0)
            .unwrap_or_else(PoisonError::into_inner);
        if *n > 0 {
            return Err(PluginError::new(
                ErrorCode::Timeout,
                format!(
                    "engine `{}`: pause_generation(wait): {} generate call(s) still running \
                     after {} s",
                    B::DIALECT.component,
                    *n,
                    timeout.as_secs()
                ),
            )
            .with_help("raise request_timeout_s, or pause with mode abort"));
        }
        Ok(())
    }

    pub(super) fn generate_batch(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        let component = B::DIALECT.component;
        if request.sampling.return_hidden_states {
            return Err(PluginError::not_supported(
                "generate with return_hidden_states",
                component,
            ));
        }
        let _inflight = self.begin()?;
        if request.prompts.iter().any(|p| p.is_empty()) {
            return Err(PluginError::invalid_input(format!(
                "engine `{component}`: generate: a prompt is empty"
            )));
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
        let completions = if request.prompts.is_empty() {
            Vec::new()
        } else {
            let job = Generation {
                request: &request,
                adapter: adapter.as_deref(),
            };
            self.backend.generate(self, job)?
        };
        Ok(GenerateResponse {
            completions: completions.into(),
            weight_version: version,
        })
    }

    pub(super) fn score_batch(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        let _inflight = self.begin()?;
        if sequences.iter().any(|s| s.is_empty()) {
            return Err(PluginError::invalid_input(format!(
                "engine `{}`: score: a sequence is empty",
                B::DIALECT.component
            )));
        }
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let adapter = lock(&self.state).active_adapter.clone();
        let job = Scoring {
            sequences: &sequences,
            adapter: adapter.as_deref(),
        };
        self.backend.score(self, job)
    }
}
