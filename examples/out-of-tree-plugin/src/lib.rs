//! An example out-of-tree engine plugin: `reverse` answers every prompt with its tokens in
//! reverse order. It shows the whole surface a plugin author touches: a manifest with declared
//! capabilities, an [`EngineImpl`], options parsed by one function that both
//! `validate_config` (what `tandem check` asks) and the constructor call, and
//! `export_plugin!`.

#![forbid(unsafe_code)]

use tandem_plugin_api::sdk::{self, EngineImpl, Plugin};
use tandem_plugin_api::serde::Deserialize;
use tandem_plugin_api::{
    Capabilities, Completion, ComponentConfig, ComponentDecl, ComponentKind, ConfigProblem,
    EngineBox, EngineHealth, FinishReason, GenerateRequest, GenerateResponse, HostBox, LogLevel,
    PluginManifest, RVec,
};

/// The plugin type.
pub struct ReversePlugin;

/// `[engine.options]` of `reverse` (serde through the API crate's re-export: this crate
/// depends on `tandem-plugin-api` only).
#[derive(Debug, Deserialize)]
#[serde(crate = "tandem_plugin_api::serde", deny_unknown_fields, default)]
struct ReverseOptions {
    /// How many times the reversed prompt is repeated (1..=8), up to `max_tokens`.
    repeat: u32,
}

impl Default for ReverseOptions {
    fn default() -> Self {
        ReverseOptions { repeat: 1 }
    }
}

impl ReverseOptions {
    /// The one parse: the options' JSON, then the range check.
    fn parse(options_json: &str) -> Result<ReverseOptions, ConfigProblem> {
        let o: ReverseOptions = sdk::parse_options(options_json)?;
        if !(1..=8).contains(&o.repeat) {
            return Err(ConfigProblem::new(
                "repeat",
                format!("must be in 1..=8, got {}", o.repeat),
            )
            .with_help("e.g. repeat = 2"));
        }
        Ok(o)
    }
}

struct ReverseEngine {
    host: HostBox,
    opts: ReverseOptions,
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
            format!("generating for {} prompts", request.prompts.len())
                .as_str()
                .into(),
        );
        let max = request.sampling.max_tokens as usize;
        let completions = request
            .prompts
            .iter()
            .map(|p| {
                let tokens: RVec<u32> =
                    std::iter::repeat_n(p.iter().rev(), self.opts.repeat as usize)
                        .flatten()
                        .take(max)
                        .copied()
                        .collect();
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
                Completion::new(tokens, logprobs, finish_reason)
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

    fn validate_config(_kind: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        ReverseOptions::parse(&config.options_json)
            .err()
            .into_iter()
            .collect()
    }

    fn new_engine(config: ComponentConfig, host: HostBox) -> sdk::Result<EngineBox> {
        let opts = ReverseOptions::parse(&config.options_json)
            .map_err(|p| p.to_error("engine `reverse`"))?;
        Ok(sdk::engine_box(ReverseEngine { host, opts }))
    }
}

tandem_plugin_api::export_plugin!(ReversePlugin);
