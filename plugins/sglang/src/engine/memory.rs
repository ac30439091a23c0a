//! Pause, continue, flush, release and resume: each checked against the [`EngineMachine`]
//! first (an illegal call never reaches SGLang), then one route, and the machine moved only
//! when SGLang accepted it.
//!
//! - pause: `/pause_generation {"mode"}` — `Abort` → `abort` (in-flight requests return with
//!   finish reason abort), `Keep` → `keep_mode` (`retract` by default, or `in_place`),
//!   `Wait` → this engine's in-flight calls finish first, then `in_place`.
//! - flush: `GET /flush_cache`; SGLang answers 400 while requests run (unless paused in
//!   `retract` mode), so a 400 is retried at 1 s up to `flush_retries` times (as slime does).
//! - release / resume: Tandem's `weights` ↔ SGLang's `weights`, `kv_cache` ↔ `kv_cache` +
//!   `cuda_graph`; a resume of both sends `weights` first, then the KV cache (slime's order).
//!
//! [`EngineMachine`]: tandem_plugin_api::lifecycle::EngineMachine

use std::time::Duration;

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::tags::{KV_CACHE, WEIGHTS};
use tandem_plugin_api::{ErrorCode, PauseMode, PluginError};

use super::calls::Deadline;
use super::{SglangEngine, illegal, lock};
use crate::http::CallError;

/// SGLang's tags for a Tandem tag.
fn sglang_tags(tag: &str) -> &'static [&'static str] {
    match tag {
        WEIGHTS => &["weights"],
        _ => &["kv_cache", "cuda_graph"],
    }
}

impl SglangEngine {
    pub(super) fn pause(&self, mode: PauseMode) -> Result<()> {
        // Paused before the call, so no new request starts while SGLang drains; back to the
        // previous state if the server refuses.
        let before = {
            let mut st = lock(&self.state);
            let before = st.machine.clone();
            st.machine.pause().map_err(illegal)?;
            before
        };
        let res = (|| {
            let sglang_mode = match mode {
                PauseMode::Abort => "abort",
                PauseMode::Keep => self.opts.keep_mode.as_str(),
                PauseMode::Wait => {
                    self.wait_idle(self.opts.request_timeout())?;
                    "in_place"
                }
            };
            self.post_text(
                "/pause_generation",
                &json!({ "mode": sglang_mode }),
                Deadline::Control,
            )
        })();
        if res.is_err() {
            lock(&self.state).machine = before;
        }
        res.map(drop)
    }

    pub(super) fn resume_generation(&self) -> Result<()> {
        let mut next = lock(&self.state).machine.clone();
        next.continue_generation().map_err(illegal)?;
        self.post_text("/continue_generation", &json!({}), Deadline::Control)?;
        lock(&self.state).machine = next;
        Ok(())
    }

    pub(super) fn flush(&self) -> Result<()> {
        let mut next = lock(&self.state).machine.clone();
        next.flush().map_err(illegal)?;
        let mut last = String::new();
        for attempt in 0..=self.opts.flush_retries {
            if attempt > 0 {
                std::thread::sleep(Duration::from_secs(1));
            }
            match self.get_raw("/flush_cache")? {
                Ok(_) => {
                    lock(&self.state).machine = next;
                    return Ok(());
                }
                Err(CallError::Status(400, m)) => last = m,
                Err(e) => return Err(self.call_error(e, "GET /flush_cache")),
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
    fn check_tags(&self, op: &str, tags: &[String]) -> Result<()> {
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

    pub(super) fn release(&self, tags: Vec<String>) -> Result<()> {
        self.check_tags("release_memory", &tags)?;
        let mut next = lock(&self.state).machine.clone();
        next.release(&tags).map_err(illegal)?;
        let mut sg: Vec<&str> = Vec::new();
        for t in &tags {
            sg.extend(sglang_tags(t));
        }
        self.memory_call("/release_memory_occupation", &sg)?;
        lock(&self.state).machine = next;
        Ok(())
    }

    pub(super) fn resume(&self, tags: Vec<String>) -> Result<()> {
        self.check_tags("resume_memory", &tags)?;
        let mut next = lock(&self.state).machine.clone();
        next.resume(&tags).map_err(illegal)?;
        // Weights first, then the KV cache (and its CUDA graphs), as slime resumes them.
        for t in [WEIGHTS, KV_CACHE] {
            if tags.iter().any(|x| x == t) {
                self.memory_call("/resume_memory_occupation", sglang_tags(t))?;
                let mut st = lock(&self.state);
                // A partial resume is recorded, so a retry resumes only what is still out.
                let _ = st.machine.resume(&[t]);
            }
        }
        lock(&self.state).machine = next;
        Ok(())
    }

    /// `/release_memory_occupation` or `/resume_memory_occupation` with SGLang's tags; the
    /// answer is JSON `null`.
    fn memory_call(&self, path: &str, tags: &[&str]) -> Result<()> {
        let v = self.post_json(path, &json!({ "tags": tags }), Deadline::Control)?;
        match v {
            Value::Null => Ok(()),
            other => Err(crate::response::unexpected(
                &format!("POST {path}"),
                &format!("{other} instead of null"),
            )),
        }
    }
}
