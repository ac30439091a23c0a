//! SGLang's lax control model on top of Tandem's strict [`EngineMachine`].
//!
//! SGLang lets a client flush, release or update at any time the server is idle; the native
//! engine accepts each lifecycle call only in the states the shared machine allows (flush
//! right after a pause, release after a pause, continue only with nothing released, updates
//! while paused with the weights resident). Each operation here holds the engine (the
//! batcher dispatches nothing meanwhile), waits for the engine call in progress, and walks
//! the engine through the legal calls that reach what the client asked:
//!
//! | client call | engine calls |
//! |---|---|
//! | pause `abort` | `pause_generation(Abort)` (queued requests aborted, running ones reported aborted) |
//! | pause `retract` / `in_place` | `pause_generation(Wait)` (the native engine has no `Keep`: the server keeps started requests itself, between chunks) |
//! | flush (idle or paused) | [pause(Wait)] → `flush_cache` → [continue] |
//! | release T | [pause(Wait)] → [flush when `kv_cache` ∈ T] → `release_memory(T')` |
//! | resume T | `resume_memory(weights)` then `resume_memory(rest)` → continue when nothing stays released and the client has not paused |
//! | update from disk | [pause(Wait)] → `apply_weight_update(CheckpointDir)` → [continue] |
//!
//! `[x]` = only when needed. Tags: SGLang's `weights` → `weights`, `kv_cache` → `kv_cache` +
//! `activations`, `cuda_graph` → nothing (tracked only).

use std::collections::BTreeSet;

use tandem_plugin_api::lifecycle::EngineState;
use tandem_plugin_api::{PResult, PauseMode, RString, RVec, UpdatePayload, WeightUpdate};

use crate::sched::{ClientPause, Server};

/// SGLang's memory tags.
pub const TAGS: [&str; 3] = ["kv_cache", "weights", "cuda_graph"];

/// A refused or failed control call: the message of a 400.
pub type Refusal = String;

fn call<T>(r: PResult<T>) -> Result<T, Refusal> {
    r.into_result().map_err(|e| e.message.to_string())
}

/// Holds the engine for one control operation (dropped: dispatching resumes).
pub struct Hold<'a>(&'a Server);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.lock().control = false;
        self.0.cv.notify_all();
    }
}

fn engine_tags(tags: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    if tags.contains("weights") {
        out.push("weights".to_owned());
    }
    if tags.contains("kv_cache") {
        out.extend(["kv_cache".to_owned(), "activations".to_owned()]);
    }
    out
}

fn rvec(tags: &[String]) -> RVec<RString> {
    tags.iter().map(|t| RString::from(t.as_str())).collect()
}

impl Server {
    /// Takes the engine: waits for another control call, stops dispatching, and (with
    /// `wait_engine`) waits for the engine call in progress.
    pub fn hold(&self, wait_engine: bool) -> Hold<'_> {
        let mut g = self.lock();
        while g.control {
            g = self.wait(g);
        }
        g.control = true;
        while wait_engine && g.in_engine {
            g = self.wait(g);
        }
        Hold(self)
    }

    fn engine_pause(&self, mode: PauseMode) -> Result<(), Refusal> {
        call(self.engine.pause_generation(mode))?;
        let mut g = self.lock();
        let _ = g.machine.pause();
        while g.in_engine {
            g = self.wait(g);
        }
        Ok(())
    }

    fn state(&self) -> EngineState {
        self.lock().machine.state().clone()
    }

    /// Continues the engine when the client has not paused and nothing is released.
    fn continue_if_free(&self) -> Result<(), Refusal> {
        let free = {
            let g = self.lock();
            g.pause.is_none()
                && g.released.is_empty()
                && matches!(
                    g.machine.state(),
                    EngineState::Paused | EngineState::Flushed
                )
        };
        if free {
            call(self.engine.continue_generation())?;
            let _ = self.lock().machine.continue_generation();
        }
        Ok(())
    }

    /// `/pause_generation`.
    pub fn pause(&self, mode: ClientPause) -> Result<(), Refusal> {
        {
            let mut g = self.lock();
            if mode == ClientPause::Abort {
                g.abort(None, "aborted by /pause_generation (mode abort)");
            }
            g.pause = Some(mode);
        }
        let abort = mode == ClientPause::Abort;
        let _h = self.hold(!abort);
        if self.state() == EngineState::Serving {
            let engine_mode = if abort {
                PauseMode::Abort
            } else {
                PauseMode::Wait
            };
            self.engine_pause(engine_mode)?;
        }
        Ok(())
    }

    /// `/continue_generation`: requests blocked by the pause go on (once every released tag
    /// is resumed).
    pub fn continue_generation(&self) -> Result<(), Refusal> {
        self.lock().pause = None;
        let _h = self.hold(true);
        self.continue_if_free()
    }

    /// `/flush_cache`: refused while requests run (see [`crate::sched::Sched::busy`]); with
    /// a `timeout` (SGLang's `?timeout=`), first waits up to that long for them to finish.
    pub fn flush(&self, timeout: Option<std::time::Duration>) -> Result<(), Refusal> {
        if let Some(t) = timeout {
            let deadline = std::time::Instant::now() + t;
            let mut g = self.lock();
            while g.busy() > 0 {
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                g = self
                    .cv
                    .wait_timeout(g, deadline - now)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
        }
        let _h = self.hold(true);
        let busy = self.lock().busy();
        if busy > 0 {
            return Err(format!("{busy} requests are running or waiting"));
        }
        match self.state() {
            EngineState::Serving => {
                self.engine_pause(PauseMode::Wait)?;
                self.flush_paused()?;
                self.continue_if_free()
            }
            EngineState::Paused => self.flush_paused(),
            // Flushed already, or released: nothing is cached.
            _ => Ok(()),
        }
    }

    fn flush_paused(&self) -> Result<(), Refusal> {
        call(self.engine.flush_cache())?;
        let _ = self.lock().machine.flush();
        Ok(())
    }

    /// `/release_memory_occupation` of SGLang tags (validated by the caller).
    pub fn release(&self, tags: BTreeSet<String>) -> Result<(), Refusal> {
        let _h = self.hold(true);
        {
            let g = self.lock();
            if let Some(t) = tags.iter().find(|t| g.released.contains(*t)) {
                return Err(format!("tag `{t}` is already released"));
            }
            let busy = g.busy();
            if busy > 0 {
                return Err(format!(
                    "release_memory_occupation needs an idle server: {busy} requests are \
                     running or waiting"
                ));
            }
        }
        let out = self.release_held(&tags);
        if out.is_err() {
            let _ = self.continue_if_free();
        }
        out
    }

    fn release_held(&self, tags: &BTreeSet<String>) -> Result<(), Refusal> {
        if self.state() == EngineState::Serving {
            self.engine_pause(PauseMode::Wait)?;
        }
        let engine = engine_tags(tags);
        if tags.contains("kv_cache") && self.state() == EngineState::Paused {
            self.flush_paused()?;
        }
        if !engine.is_empty() {
            call(self.engine.release_memory(rvec(&engine)))?;
            let _ = self.lock().machine.release(&engine);
        }
        self.lock().released.extend(tags.iter().cloned());
        Ok(())
    }

    /// `/resume_memory_occupation`: weights first, then the rest; continues when nothing
    /// stays released and the client has not paused.
    pub fn resume(&self, tags: BTreeSet<String>) -> Result<(), Refusal> {
        let _h = self.hold(true);
        {
            let g = self.lock();
            if let Some(t) = tags.iter().find(|t| !g.released.contains(*t)) {
                return Err(format!(
                    "tag `{t}` is not released (released: {:?})",
                    g.released
                ));
            }
        }
        let engine = engine_tags(&tags);
        let (weights, rest): (Vec<String>, Vec<String>) =
            engine.into_iter().partition(|t| t == "weights");
        for part in [weights, rest] {
            if !part.is_empty() {
                call(self.engine.resume_memory(rvec(&part)))?;
                let _ = self.lock().machine.resume(&part);
            }
        }
        {
            let mut g = self.lock();
            for t in &tags {
                g.released.remove(t);
            }
        }
        self.continue_if_free()
    }

    /// `/update_weights_from_disk`: the checkpoint directory at `version`, relabelled
    /// `label`. Waits for the engine call in progress (SGLang's writer lock).
    pub fn update_from_disk(
        &self,
        dir: &str,
        version: u64,
        label: Option<String>,
    ) -> Result<(), Refusal> {
        let _h = self.hold(true);
        let served = self.lock().machine.version();
        if version < served {
            return Err(format!(
                "weight version {version} is below the served version {served}: versions \
                 never go down"
            ));
        }
        let out = self.update_held(dir, version, label);
        let _ = self.continue_if_free();
        out
    }

    fn update_held(&self, dir: &str, version: u64, label: Option<String>) -> Result<(), Refusal> {
        if self.state() == EngineState::Serving {
            self.engine_pause(PauseMode::Wait)?;
        }
        self.lock()
            .machine
            .begin_update(version)
            .map_err(|e| e.to_string())?;
        let update = WeightUpdate {
            version,
            payload: UpdatePayload::CheckpointDir { dir: dir.into() },
            digest: RString::new(),
        };
        let r = call(self.engine.apply_weight_update(update));
        let mut g = self.lock();
        g.machine.finish_update(r.is_ok());
        if r.is_ok() {
            g.weights_dir = (dir.to_string(), None);
        }
        if let (Ok(_), Some(l)) = (&r, label) {
            g.label = l;
        }
        r.map(drop)
    }

    /// `/abort_request`: queued matches finish aborted at once; running ones are reported
    /// aborted when their call returns (`abort_all` also aborts the engine call itself).
    pub fn abort_request(&self, rid: Option<&str>) -> Result<usize, Refusal> {
        let (n, running) = {
            let mut g = self.lock();
            let n = g.abort(rid, "aborted by /abort_request");
            (n, g.in_engine && g.pause.is_none())
        };
        if rid.is_none() && running {
            let _h = self.hold(false);
            if self.state() == EngineState::Serving {
                self.engine_pause(PauseMode::Abort)?;
                self.continue_if_free()?;
            }
        }
        Ok(n)
    }

    /// `/unload_lora_adapter`: waits for the engine call in progress first.
    pub fn unload_adapter(&self, name: &str) -> Result<(), Refusal> {
        let _h = self.hold(true);
        call(self.engine.unload_adapter(name.into()))?;
        self.lock().adapters.remove(name);
        Ok(())
    }

    /// `/load_lora_adapter`.
    pub fn load_adapter(&self, name: &str, dir: &str) -> Result<(), Refusal> {
        if self.lock().adapters.contains_key(name) {
            return Err(format!("an adapter named `{name}` is already loaded"));
        }
        call(self.engine.load_adapter(name.into(), dir.into()))?;
        self.lock().adapters.insert(name.to_owned(), dir.to_owned());
        Ok(())
    }
}
