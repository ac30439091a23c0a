//! The engine under test ([`EngineHarness`]: the component, its declaration, host services
//! and a mirror of the state machine) and the engine [`checks`]: those of a serving engine in
//! `serving.rs`, those of its lifecycle in `lifecycle.rs`.

mod hidden;
mod lifecycle;
mod serving;

use crate::expect::ok;
use crate::harness::{Failure, Outcome};
use crate::setup::{EngineSetup, Groups, Parts, parts};
use tandem_memory::MemoryManager;
use tandem_plugin_api::lifecycle::{EngineMachine, EngineOp, EngineState};
use tandem_plugin_api::{
    ComponentDecl, ComponentKind, EngineBox, GenerateRequest, GenerateResponse, PResult, PauseMode,
    PluginError, RResult, RString, RVec, SamplingParams, UpdatePayload, WeightUpdate,
};
use tandem_services::Services;

/// A constructed, started engine with the host's real services.
pub struct EngineHarness {
    /// The engine, as the host sees it (an ABI trait object).
    pub engine: EngineBox,
    /// Its declaration (capabilities).
    pub decl: ComponentDecl,
    /// The services it was constructed with (a CPU memory manager of its own).
    pub services: Services,
    /// What the state machine says the engine's state is after every call made through the
    /// harness.
    pub machine: EngineMachine,
    /// The setup it was built from.
    pub setup: EngineSetup,
    /// The plugin's API level (its manifest's).
    pub api_level: u32,
    run_dir: Option<tempfile::TempDir>,
}

impl Drop for EngineHarness {
    fn drop(&mut self) {
        // Best effort: a server the engine launched goes with it.
        let _ = self.engine.shutdown();
    }
}

impl EngineHarness {
    /// Loads the plugin, constructs and starts the engine, and checks it reports ready.
    pub fn new(setup: EngineSetup) -> Result<EngineHarness, Failure> {
        Self::with_transport(setup, None)
    }

    /// [`EngineHarness::new`] with `transport` groups attached to the engine's services.
    pub(crate) fn with_transport(
        setup: EngineSetup,
        transport: Option<Groups>,
    ) -> Result<EngineHarness, Failure> {
        let Parts {
            module,
            decl,
            run_dir,
            services,
            config,
        } = parts(
            &setup.source,
            ComponentKind::Engine,
            &setup.component,
            &setup.model,
            &setup.options_json,
            transport,
        )?;
        let api_level = match (module.manifest())() {
            RResult::ROk(m) => m.api_level,
            RResult::RErr(e) => {
                return Err(Failure::new("the manifest reads", e.message.to_string()));
            }
        };
        let engine = ok(
            (module.new_engine())(config, services.handle()),
            "the engine constructs",
            "new_engine",
        )?;
        ok(engine.start(), "the engine starts", "start")?;
        let health = ok(engine.health(), "the engine reports health", "health")?;
        if !health.ready {
            return Err(Failure::new(
                "a started engine is ready",
                format!("health after start: not ready ({})", health.detail),
            ));
        }
        Ok(EngineHarness {
            engine,
            machine: EngineMachine::new(health.weight_version),
            decl,
            services,
            setup,
            api_level,
            run_dir: Some(run_dir),
        })
    }

    /// The first declared pause mode (`Wait` preferred), if any.
    pub fn pause_mode(&self) -> Option<PauseMode> {
        let modes = &self.decl.caps.pause_modes;
        if modes.contains(&PauseMode::Wait) {
            Some(PauseMode::Wait)
        } else {
            modes.first().copied()
        }
    }

    /// Greedy request over the setup's prompts.
    pub fn greedy(&self) -> GenerateRequest {
        GenerateRequest {
            prompts: self
                .setup
                .prompts
                .iter()
                .map(|p| p.iter().copied().collect())
                .collect(),
            sampling: SamplingParams {
                temperature: 0.0,
                max_tokens: self.setup.max_tokens,
                logprobs: true,
                ..SamplingParams::default()
            },
            adapter: tandem_plugin_api::ROption::RNone,
        }
    }

    /// Greedy generation that must succeed.
    pub fn generate(&self, rule: &'static str) -> Result<GenerateResponse, Failure> {
        ok(self.engine.generate(self.greedy()), rule, "generate")
    }

    /// Calls the engine for a lifecycle `op` and, when it succeeds, moves the mirror machine.
    /// Refuses to call at all when the machine says the op is illegal (a check's bug).
    pub fn step(&mut self, op: EngineOp, mode: PauseMode) -> PResult<()> {
        let r = self.call(&op, mode);
        if r.is_ok() {
            self.advance(op);
        }
        r
    }

    /// The engine call for `op`, without touching the mirror.
    pub(crate) fn call(&self, op: &EngineOp, mode: PauseMode) -> PResult<()> {
        let tags = |t: &std::collections::BTreeSet<String>| -> RVec<RString> {
            t.iter().map(|s| RString::from(s.as_str())).collect()
        };
        match op {
            EngineOp::Pause => self.engine.pause_generation(mode),
            EngineOp::Flush => self.engine.flush_cache(),
            EngineOp::Release(t) => self.engine.release_memory(tags(t)),
            EngineOp::Resume(t) => self.engine.resume_memory(tags(t)),
            EngineOp::Continue => self.engine.continue_generation(),
            EngineOp::BeginUpdate(v) => match self.checkpoint_update(*v) {
                Some(u) => match self.engine.apply_weight_update(u) {
                    RResult::ROk(_) => RResult::ROk(()),
                    RResult::RErr(e) => RResult::RErr(e),
                },
                None => RResult::RErr(PluginError::not_supported("update", "harness")),
            },
            EngineOp::EndUpdate | EngineOp::AbortUpdate => RResult::ROk(()),
        }
    }

    /// Moves the mirror after a successful call (an update is begin + end).
    pub(crate) fn advance(&mut self, op: EngineOp) {
        let update = matches!(op, EngineOp::BeginUpdate(_));
        if self.machine.apply(op).is_ok() && update {
            let _ = self.machine.end_update();
        }
    }

    /// A checkpoint-dir update of the served model's own directory at `version`, when the
    /// engine declares checkpoint-dir updates.
    pub fn checkpoint_update(&self, version: u64) -> Option<WeightUpdate> {
        self.decl
            .caps
            .update_kinds
            .contains(&tandem_plugin_api::UpdateKind::CheckpointDir)
            .then(|| WeightUpdate {
                version,
                payload: UpdatePayload::CheckpointDir {
                    dir: self.setup.model.display().to_string().into(),
                },
                digest: RString::new(),
            })
    }

    /// Drives the engine back to Serving through legal calls (after every passing check).
    pub fn to_serving(&mut self) -> Outcome {
        let mode = self.pause_mode().unwrap_or(PauseMode::Wait);
        for _ in 0..4 {
            let op = match self.machine.state().clone() {
                EngineState::Serving => return Ok(()),
                EngineState::Released(t) => EngineOp::Resume(t),
                EngineState::Updating { .. } => EngineOp::AbortUpdate,
                EngineState::Paused | EngineState::Flushed => EngineOp::Continue,
            };
            ok(self.step(op.clone(), mode), "reset", &op.to_string())?;
        }
        Err(Failure::new(
            "reset",
            "the engine did not get back to serving",
        ))
    }

    /// Keeps the run directory (the component's logs) after the harness is dropped.
    pub fn keep_run_dir(&mut self) -> Option<std::path::PathBuf> {
        self.run_dir.take().map(tempfile::TempDir::keep)
    }

    /// Resident bytes of the engine's host memory regions.
    pub fn resident_bytes(&self) -> u64 {
        self.services
            .memory_manager()
            .map_or(0, MemoryManager::resident_bytes)
    }
}

/// The engine checks.
pub mod checks {
    pub use super::hidden::hidden_states_as_declared;
    pub use super::lifecycle::{
        follows_the_state_machine, pause_modes, release_and_resume, undeclared_updates,
    };
    pub use super::serving::{
        declared_and_healthy, generate_is_well_formed, score_agrees_with_generate,
    };
}
