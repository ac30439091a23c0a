//! Generation: sampling parameters, requests and completions, pause modes, engine health.

use abi_stable::StableAbi;
use abi_stable::std_types::{ROption, RString, RVec};
use serde::{Deserialize, Serialize};

/// Sampling parameters for one generation request.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0.0` means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass in `(0, 1]`; `1.0` disables it.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables it.
    pub top_k: u32,
    /// Maximum number of new tokens per prompt.
    pub max_tokens: u32,
    /// Generation of a prompt stops after any of these tokens.
    pub stop_token_ids: RVec<u32>,
    /// Seed for reproducible sampling; `None` lets the engine choose.
    pub seed: ROption<u64>,
    /// Return the logprob of every generated token.
    pub logprobs: bool,
    /// Return the last layer's hidden state of every generated token.
    pub return_hidden_states: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 16,
            stop_token_ids: RVec::new(),
            seed: ROption::RNone,
            logprobs: true,
            return_hidden_states: false,
        }
    }
}

/// A batch of token-id prompts to complete with one set of sampling parameters.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// Prompt token ids, one list per sequence.
    #[serde(with = "crate::wire::packed::nested")]
    pub prompts: RVec<RVec<u32>>,
    /// Sampling parameters shared by the batch.
    pub sampling: SamplingParams,
    /// LoRA adapter to generate with (by loaded name); `None` uses the base weights.
    pub adapter: ROption<RString>,
}

/// Why a sequence stopped.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Reached `max_tokens`.
    Length,
    /// Produced a stop token (included in `tokens`).
    Stop,
    /// Aborted by `pause_generation(Abort)` or shutdown.
    Aborted,
}

/// One completed sequence.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated token ids (prompt excluded).
    #[serde(with = "crate::wire::packed")]
    pub tokens: RVec<u32>,
    /// Logprob of each generated token under the sampling distribution before
    /// temperature/top-p/top-k (empty unless requested).
    #[serde(with = "crate::wire::packed")]
    pub logprobs: RVec<f32>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Row-major `[tokens.len(), hidden_dim]` last-layer hidden states (empty unless requested).
    #[serde(with = "crate::wire::packed")]
    pub hidden_states: RVec<f32>,
    /// Width of a hidden-state row (0 when none were returned).
    pub hidden_dim: u32,
}

impl Completion {
    /// A completion without hidden states.
    pub fn new(
        tokens: impl Into<RVec<u32>>,
        logprobs: impl Into<RVec<f32>>,
        finish_reason: FinishReason,
    ) -> Self {
        Completion {
            tokens: tokens.into(),
            logprobs: logprobs.into(),
            finish_reason,
            hidden_states: RVec::new(),
            hidden_dim: 0,
        }
    }
}

/// The engine's answer to a [`GenerateRequest`].
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GenerateResponse {
    /// One completion per prompt, in request order.
    pub completions: RVec<Completion>,
    /// Weight version that produced these tokens.
    pub weight_version: u64,
}

/// How `pause_generation` treats requests in flight.
#[repr(u8)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Abort in-flight requests; they return with [`FinishReason::Aborted`].
    Abort,
    /// Wait for in-flight requests to finish, then pause.
    Wait,
    /// Freeze in-flight requests in place; they continue after `continue_generation`.
    Keep,
}

impl PauseMode {
    /// Lower-case name used in job files and output.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Abort => "abort",
            PauseMode::Wait => "wait",
            PauseMode::Keep => "keep",
        }
    }
}

/// Engine health as reported by `health`.
#[repr(C)]
#[derive(StableAbi, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EngineHealth {
    /// Ready to accept generation requests.
    pub ready: bool,
    /// Weight version currently served.
    pub weight_version: u64,
    /// Free-form detail (server URL, state), for humans.
    pub detail: RString,
}
