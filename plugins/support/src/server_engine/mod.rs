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
//! - [`plugin`]: the exported `Plugin` of a plugin whose one component is such an engine.
//! - [`options`]: the option checks and paths both plugins apply; [`testing`]: a model
//!   directory fixture for the plugins' tests of what their options enable.
//!
//! What differs between servers is a [`Backend`]: its [`Dialect`] (names, the server the helps
//! name, what a 503 means), its constructor, how it starts, and one method per route-level
//! step ([`Generation`], [`Scoring`] and [`Checkpoint`] are what those steps are given).
//!
//! [`EngineImpl`]: tandem_plugin_api::sdk::EngineImpl
//! [`EngineMachine`]: tandem_plugin_api::lifecycle::EngineMachine

mod calls;
mod engine;
pub mod http;
pub mod launch;
pub mod options;
pub mod plugin;
mod serve;
pub mod testing;
mod update;

use std::path::Path;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{
    Completion, ComponentConfig, EngineHealth, ErrorCode, GenerateRequest, HostBox, PauseMode,
    PluginError, RVec, UpdatePayload, WeightUpdate,
};

pub use engine::{ServerEngine, State};
pub use http::{CallError, Client, Trace};
pub use launch::{Launcher, Server};

/// Names and error mapping of one kind of server.
#[derive(Debug)]
pub struct Dialect {
    /// Component name (`vllm`): every error starts with ``engine `vllm` ``.
    pub component: &'static str,
    /// The server's own name in messages (`vLLM`).
    pub display: &'static str,
    /// The server and version the plugin speaks to, as helps name it
    /// (`SGLang 0.5.23 (or tandem serve)`).
    pub server: &'static str,
    /// What a 503 answer means for this server (`Unavailable` unless set).
    pub status_503: ErrorCode,
}

impl Dialect {
    /// The dialect of component `component`, called `display` in messages, speaking to
    /// `server`.
    pub const fn new(component: &'static str, display: &'static str, server: &'static str) -> Self {
        Dialect {
            component,
            display,
            server,
            status_503: ErrorCode::Unavailable,
        }
    }

    /// The same, with a 503 answer mapped to `code`.
    pub const fn with_503(self, code: ErrorCode) -> Self {
        Dialect {
            status_503: code,
            ..self
        }
    }

    /// The error for an answer of `route` that lacks `what`.
    pub fn unexpected(&self, route: &str, what: &str) -> PluginError {
        PluginError::runtime(format!(
            "engine `{}`: {route}: unexpected answer: {what}",
            self.component
        ))
        .with_help(format!(
            "the server does not answer like {}; read its log",
            self.server
        ))
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

/// A generation for the backend: a non-empty batch of non-empty prompts, and the adapter it
/// runs under (the request's, else the active one).
#[derive(Debug, Clone, Copy)]
pub struct Generation<'a> {
    /// The request.
    pub request: &'a GenerateRequest,
    /// The adapter, `None` for the base weights.
    pub adapter: Option<&'a str>,
}

/// Scoring for the backend: a non-empty batch of non-empty sequences and the active adapter.
#[derive(Debug, Clone, Copy)]
pub struct Scoring<'a> {
    /// The sequences.
    pub sequences: &'a [RVec<u32>],
    /// The adapter, `None` for the base weights.
    pub adapter: Option<&'a str>,
}

/// A checkpoint update for the backend: its directory and the update itself.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoint<'a> {
    /// The checkpoint directory.
    pub dir: &'a Path,
    /// The update (version, digest).
    pub update: &'a WeightUpdate,
}

/// What the engine takes from the options: deadlines and whether adapters are enabled.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Seconds a generate or score call may take (`request_timeout_s`).
    pub request_timeout_s: u64,
    /// Seconds any other call may take (`control_timeout_s`).
    pub control_timeout_s: u64,
    /// Adapters enabled (`enable_lora`): adapter updates and calls need it.
    pub lora: bool,
}

/// What one kind of server does at each step; the [`ServerEngine`] around it does the rest
/// (lifecycle checks, state, in-flight accounting, the server slot). Every method that takes
/// the engine runs outside the engine's locks and may call its HTTP helpers.
pub trait Backend: Send + Sync + Sized + 'static {
    /// Names and helps.
    const DIALECT: &'static Dialect;
    /// Help of an adapter call with LoRA off (which option enables it).
    const LORA_HELP: &'static str;
    /// Whether [`Backend::load_adapter`] replaces a loaded adapter of the same name itself;
    /// otherwise an update re-applied under a loaded name unloads it first.
    const RELOADS_ADAPTERS: bool;
    /// The engine of `config` (options checked, nothing started): the plugin's constructor.
    fn engine(config: &ComponentConfig, host: HostBox) -> Result<ServerEngine<Self>>;
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
    fn generate(&self, engine: &ServerEngine<Self>, job: Generation<'_>)
    -> Result<Vec<Completion>>;
    /// Logprobs of a non-empty batch of non-empty sequences under the active adapter.
    fn score(&self, engine: &ServerEngine<Self>, job: Scoring<'_>) -> Result<Vec<RVec<f32>>>;
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
    fn load_checkpoint(&self, engine: &ServerEngine<Self>, job: Checkpoint<'_>) -> Result<String>;
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
    /// After an update was applied: the server's version label set and/or checked.
    fn settle_version(&self, engine: &ServerEngine<Self>, update: &WeightUpdate) -> Result<()>;
}
