//! An example out-of-tree engine plugin: `reverse` answers every prompt with its tokens in
//! reverse order. It shows the whole surface a plugin author touches: a manifest with declared
//! capabilities, an [`EngineImpl`], a constructor that validates its options, and
//! `export_plugin!`.

use tandem_plugin_api::sdk::{self, EngineImpl, Plugin};
use tandem_plugin_api::{
    Capabilities, ComponentConfig, ComponentDecl, ComponentKind, Completion, EngineBox,
    EngineHealth, FinishReason, GenerateRequest, GenerateResponse, HostBox, LogLevel,
    PluginManifest, RVec,
};

/// The plugin type.
pub struct ReversePlugin;

struct ReverseEngine {
    host: HostBox,
}

impl EngineImpl for ReverseEngine {
    fn component(&self) -> &str {
        "reverse"
    }

    fn health(&self) -> sdk::Result<EngineHealth> {
        Ok(EngineHealth {
            ready: true,
            weight_version: 0,
            detail: "reverse example engine".into(),
        })
    }

    fn generate(&self, request: GenerateRequest) -> sdk::Result<GenerateResponse> {
        self.host.log(
            LogLevel::Debug,
            "reverse".into(),
            format!("generating for {} prompts", request.prompts.len()).as_str().into(),
        );
        let max = request.sampling.max_tokens as usize;
        let completions = request
            .prompts
            .iter()
            .map(|p| {
                let tokens: RVec<u32> = p.iter().rev().take(max).copied().collect();
                let finish_reason = if tokens.len() == max {
                    FinishReason::Length
                } else {
                    FinishReason::Stop
                };
                // Deterministic: each token has probability 1.
                let logprobs = if request.sampling.logprobs {
                    vec![0.0; tokens.len()].into()
                } else {
                    RVec::new()
                };
                Completion {
                    tokens,
                    logprobs,
                    finish_reason,
                    hidden_states: RVec::new(),
                    hidden_dim: 0,
                }
            })
            .collect();
        Ok(GenerateResponse {
            completions,
            weight_version: 0,
        })
    }
}

impl Plugin for ReversePlugin {
    fn manifest() -> PluginManifest {
        sdk::manifest(
            "example-reverse",
            env!("CARGO_PKG_VERSION"),
            vec![ComponentDecl {
                kind: ComponentKind::Engine,
                name: "reverse".into(),
                description: "example out-of-tree engine: echoes prompts reversed".into(),
                caps: Capabilities::default(),
            }],
        )
    }

    fn new_engine(_config: ComponentConfig, host: HostBox) -> sdk::Result<EngineBox> {
        Ok(sdk::engine_box(ReverseEngine { host }))
    }
}

tandem_plugin_api::export_plugin!(ReversePlugin);
