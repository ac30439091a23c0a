//! An engine that is an HTTP-driven inference server (vLLM, SGLang): what the `vllm` and
//! `sglang` plugins share, so each adds only its routes, options and answer parsing — after
//! the model of [`crate::torchrun`] for trainers.
//!
//! - [`ServerEngine`] (`engine.rs`): the [`EngineImpl`] every such plugin exports — the shared
//!   [`EngineMachine`] checked before any route is called and moved only when the server
//!   accepted the call, the engine state (version, served directory, adapters, metrics),
//!   pause / continue / flush / release / resume, stats.
//! - `serve.rs`: generation admission, the in-flight count `PauseMode::Wait` can wait for,
//!   `generate` / `score` up to the request body.
//! - `update.rs`: weight updates — [`ServerEngine::apply_update`] is the one place a
//!   `CheckpointDir` or `Adapter` update is applied — and adapter bookkeeping.
//! - `calls.rs`: the server slot (started on first use, replaced by a restart) and the HTTP
//!   calls with their deadlines; a dead launched server is one error with its log tail.
//! - [`launch`]: the launcher (interpreter or `command`), pre-flight checks, the supervised
//!   server process or an attached one, and the health wait.
//! - [`http`]: the client (timeouts, bearer token, trace) and its errors.
//! - [`options`]: the option checks and paths both plugins apply.
//!
//! What differs between servers is a [`Backend`]: its [`Dialect`] (names and helps), how it
//! starts, and one method per route-level step.
//!
//! [`EngineImpl`]: tandem_plugin_api::sdk::EngineImpl
//! [`EngineMachine`]: tandem_plugin_api::lifecycle::EngineMachine

mod calls;
mod engine;
pub mod http;
pub mod launch;
pub mod options;
mod serve;
mod update;

use std::path::Path;
use std::time::Duration;

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{
    Completion, EngineHealth, ErrorCode, GenerateRequest, PauseMode, PluginError, RVec,
    UpdatePayload, WeightUpdate,
};

pub use engine::{ServerEngine, State};
pub use http::{CallError, Client, Trace};
pub use launch::{Launcher, Server};

/// Names, helps and error mapping of one kind of server.
#[derive(Debug)]
pub struct Dialect {
    /// Component name (`vllm`): every error starts with ``engine `vllm` ``.
    pub component: &'static str,
    /// The server's own name in messages (`vLLM`).
    pub display: &'static str,
    /// Help of a call that timed out.
    pub timeout_help: &'static str,
    /// Help of an answer that is not the documented shape.
    pub unexpected_help: &'static str,
    /// Help of a 404 (a route the server lacks).
    pub missing_route_help: &'static str,
    /// What a 503 means for this server.
    pub status_503: ErrorCode,
    /// Help of an adapter call with LoRA off.
    pub lora_help: &'static str,
}

impl Dialect {
    /// The error for an answer of `route` that lacks `what`.
    pub fn unexpected(&self, route: &str, what: &str) -> PluginError {
        PluginError::runtime(format!(
            "engine `{}`: {route}: unexpected answer: {what}",
            self.component
        ))
        .with_help(self.unexpected_help)
    }
}

/// Which deadline a call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// Generation and scoring (`request_timeout_s`).
    Request,
    /// Everything else (`control_timeout_s`).
    Control,
}

/// What one kind of server does at each step; the [`ServerEngine`] around it does the rest
/// (lifecycle checks, state, in-flight accounting, the server slot). Every method that takes
/// the engine runs outside the engine's locks and may call its HTTP helpers.
pub trait Backend: Send + Sync + Sized + 'static {
    /// Names and helps.
    fn dialect(&self) -> &'static Dialect;
    /// The deadline of a call.
    fn timeout(&self, deadline: Deadline) -> Duration;
    /// Whether adapters are enabled (`enable_lora`).
    fn lora(&self) -> bool;
    /// Starts (or attaches to) the server; called when the slot is empty. Launching goes
    /// through [`ServerEngine::launching`] so the start is logged.
    fn start(&self, engine: &ServerEngine<Self>) -> Result<Server>;
    /// After a start, with the server in the slot (e.g. label the served version).
    fn started(&self, _engine: &ServerEngine<Self>, _client: &Client) -> Result<()> {
        Ok(())
    }
    /// `health` of a started server.
    fn health(&self, engine: &ServerEngine<Self>) -> Result<EngineHealth>;
    /// Generation of a non-empty batch of non-empty prompts under `adapter` (the request's,
    /// else the active one): the completions in prompt order.
    fn generate(
        &self,
        engine: &ServerEngine<Self>,
        request: &GenerateRequest,
        adapter: Option<&str>,
    ) -> Result<Vec<Completion>>;
    /// Logprobs of a non-empty batch of non-empty sequences under the active adapter.
    fn score(
        &self,
        engine: &ServerEngine<Self>,
        sequences: &[RVec<u32>],
        adapter: Option<&str>,
    ) -> Result<Vec<RVec<f32>>>;
    /// The pause route (the machine is already paused; it goes back if this fails).
    fn pause(&self, engine: &ServerEngine<Self>, mode: PauseMode) -> Result<()>;
    /// The continue route.
    fn continue_generation(&self, engine: &ServerEngine<Self>) -> Result<()>;
    /// The cache flush route.
    fn flush(&self, engine: &ServerEngine<Self>) -> Result<()>;
    /// `NotSupported` for tags this server cannot release (`op` is `release_memory` or
    /// `resume_memory`); checked before the lifecycle.
    fn check_memory(&self, op: &str, tags: &[String]) -> Result<()>;
    /// The release route for `tags`.
    fn release(&self, engine: &ServerEngine<Self>, tags: &[String]) -> Result<()>;
    /// The resume route for one tag (weights are resumed before the KV cache).
    fn resume(&self, engine: &ServerEngine<Self>, tag: &str) -> Result<()>;
    /// The `NotSupported` error of an update kind this server does not apply.
    fn unsupported_update(&self, payload: &UpdatePayload) -> PluginError;
    /// Loads the checkpoint `dir` of `update` into the server (and records it as the served
    /// directory); returns the digest the server reports ("" for none).
    fn load_checkpoint(
        &self,
        engine: &ServerEngine<Self>,
        dir: &Path,
        update: &WeightUpdate,
    ) -> Result<String>;
    /// The adapter load route; `loaded` when `name` is loaded already.
    fn load_adapter(
        &self,
        engine: &ServerEngine<Self>,
        name: &str,
        dir: &str,
        loaded: bool,
    ) -> Result<()>;
    /// The adapter unload route.
    fn unload_adapter(&self, engine: &ServerEngine<Self>, name: &str) -> Result<()>;
    /// Whether [`Backend::load_adapter`] replaces a loaded adapter of the same name itself;
    /// otherwise an update re-applied under a loaded name unloads it first.
    fn reloads_adapters(&self) -> bool;
    /// After an update was applied: the server's version label set and/or checked.
    fn settle_version(&self, engine: &ServerEngine<Self>, update: &WeightUpdate) -> Result<()>;
}
