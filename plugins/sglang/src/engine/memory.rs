//! SGLang's pause, flush, release and resume routes (the kit checks each against the
//! lifecycle first and moves it only when SGLang accepted the call):
//!
//! - pause: `/pause_generation {"mode"}` — `Abort` → `abort` (in-flight requests return with
//!   finish reason abort), `Keep` → `keep_mode` (`retract` by default, or `in_place`),
//!   `Wait` → this engine's in-flight calls finish first, then `in_place`.
//! - flush: `GET /flush_cache`; SGLang answers 400 while requests run (unless paused in
//!   `retract` mode), so a 400 is retried at 1 s up to `flush_retries` times (as slime does).
//! - release / resume: Tandem's `weights` ↔ SGLang's `weights`, `kv_cache` ↔ `kv_cache` +
//!   `cuda_graph`; the answer is JSON `null`.

use std::time::Duration;

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::tags::{KV_CACHE, WEIGHTS};
use tandem_plugin_api::{ErrorCode, PauseMode, PluginError};
use tandem_plugin_support::server_engine::{CallError, Deadline};

use super::{Sglang, SglangEngine};

/// SGLang's tags for a Tandem tag.
pub(super) fn sglang_tags(tag: &str) -> &'static [&'static str] {
    match tag {
        WEIGHTS => &["weights"],
        _ => &["kv_cache", "cuda_graph"],
    }
}

impl Sglang {
    pub(super) fn pause_route(&self, engine: &SglangEngine, mode: PauseMode) -> Result<()> {
        let sglang_mode = match mode {
            PauseMode::Abort => "abort",
            PauseMode::Keep => self.opts.keep_mode.as_str(),
            PauseMode::Wait => {
                engine.wait_idle(engine.timeout(Deadline::Request))?;
                "in_place"
            }
        };
        engine
            .post(
                "/pause_generation",
                Some(&json!({ "mode": sglang_mode })),
                Deadline::Control,
            )
            .map(drop)
    }

    pub(super) fn flush_route(&self, engine: &SglangEngine) -> Result<()> {
        let mut last = String::new();
        for attempt in 0..=self.opts.flush_retries {
            if attempt > 0 {
                std::thread::sleep(Duration::from_secs(1));
            }
            match engine.get("/flush_cache")? {
                Ok(_) => return Ok(()),
                Err(CallError::Status(400, m)) => last = m,
                Err(e) => return Err(engine.call_error(e, "GET /flush_cache")),
            }
        }
        Err(PluginError::new(
            ErrorCode::InvalidState,
            format!(
                "engine `sglang`: GET /flush_cache refused {} times (400: {last})",
                self.opts.flush_retries + 1
            ),
        )
        .with_help(
            "requests still hold the KV cache: pause with keep_mode = \"retract\" (or abort / \
             wait) before flushing, or raise flush_retries",
        ))
    }

    /// The declared tags (memory saver on) or `NotSupported`; an unknown tag is refused.
    pub(super) fn check_tags(&self, op: &str, tags: &[String]) -> Result<()> {
        if !self.opts.enable_memory_saver {
            return Err(PluginError::not_supported(
                &format!("{op}({})", tags.join(", ")),
                "sglang",
            )
            .with_help(
                "set enable_memory_saver = true (SGLang's --enable-memory-saver), or run the \
                 job with needs_offload = false",
            ));
        }
        if let Some(t) = tags
            .iter()
            .find(|t| ![WEIGHTS, KV_CACHE].contains(&t.as_str()))
        {
            return Err(PluginError::not_supported(&format!("{op}({t})"), "sglang")
                .with_help("engine `sglang` releases `weights` and `kv_cache` only"));
        }
        Ok(())
    }

    /// `/release_memory_occupation` or `/resume_memory_occupation` with SGLang's tags; the
    /// answer is JSON `null`.
    pub(super) fn memory_call(
        &self,
        engine: &SglangEngine,
        path: &str,
        tags: &[&str],
    ) -> Result<()> {
        let v = engine.post_json(path, &json!({ "tags": tags }), Deadline::Control)?;
        match v {
            Value::Null => Ok(()),
            other => Err(crate::response::unexpected(
                &format!("POST {path}"),
                &format!("{other} instead of null"),
            )),
        }
    }
}
