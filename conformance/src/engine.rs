//! The engine under test ([`EngineHarness`]: the component, its declaration, host services
//! and a mirror of the state machine) and the engine checks.

use crate::harness::{Failure, Outcome};
use crate::setup::{EngineSetup, Parts, parts};
use tandem_memory::MemoryManager;
use tandem_plugin_api::lifecycle::{EngineMachine, EngineOp, EngineState};
use tandem_plugin_api::{
    ComponentDecl, ComponentKind, EngineBox, ErrorCode, GenerateRequest, GenerateResponse, PResult,
    PauseMode, PluginError, RResult, RString, RVec, SamplingParams, UpdatePayload, WeightUpdate,
};
use tandem_services::Services;

/// Every pause mode the ABI knows.
pub(crate) const ALL_MODES: [PauseMode; 3] = [PauseMode::Abort, PauseMode::Wait, PauseMode::Keep];

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
    run_dir: Option<tempfile::TempDir>,
}

impl Drop for EngineHarness {
    fn drop(&mut self) {
        // Best effort: a server the engine launched goes with it.
        let _ = self.engine.shutdown();
    }
}

/// `Ok` value or a failure of `rule` carrying the plugin's error.
pub(crate) fn ok<T>(r: PResult<T>, rule: &'static str, what: &str) -> Result<T, Failure> {
    match r {
        RResult::ROk(v) => Ok(v),
        RResult::RErr(e) => Err(Failure::new(rule, format!("{what} failed: {}", one(&e)))),
    }
}

pub(crate) fn one(e: &PluginError) -> String {
    format!("{} ({})", e.message, e.code.as_str())
}

/// Expects a refusal; returns the error.
pub(crate) fn refused<T: std::fmt::Debug>(
    r: PResult<T>,
    rule: &'static str,
    what: &str,
) -> Result<PluginError, Failure> {
    match r {
        RResult::ROk(v) => Err(Failure::new(
            rule,
            format!("{what} was accepted (returned {v:?}); it must be refused"),
        )),
        RResult::RErr(e) if e.code == ErrorCode::Panicked => Err(Failure::new(
            "no panic",
            format!("{what} panicked: {}", e.message),
        )),
        RResult::RErr(e) => Ok(e),
    }
}

/// Expects `NotSupported`.
pub(crate) fn not_supported<T: std::fmt::Debug>(r: PResult<T>, what: &str) -> Outcome {
    let e = refused(r, "undeclared operations are not supported", what)?;
    if e.code == ErrorCode::NotSupported {
        Ok(())
    } else {
        Err(Failure::new(
            "undeclared operations are not supported",
            format!(
                "{what} is not declared, so it must answer not_supported, not {}",
                one(&e)
            ),
        ))
    }
}

impl EngineHarness {
    /// Loads the plugin, constructs and starts the engine, and checks it reports ready.
    pub fn new(setup: EngineSetup) -> Result<EngineHarness, Failure> {
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
        )?;
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
    use super::*;

    /// The engine is declared, starts, reports ready, and its declared capabilities are
    /// well-formed (known tags, no duplicates).
    pub fn declared_and_healthy(h: &mut EngineHarness) -> Outcome {
        let rule = "declarations are well-formed";
        let caps = &h.decl.caps;
        for t in caps.releasable_tags.iter() {
            if !tandem_plugin_api::tags::ALL.contains(&t.as_str()) {
                return Err(Failure::new(rule, format!("unknown releasable tag `{t}`")));
            }
        }
        let mut modes: Vec<&str> = caps.pause_modes.iter().map(|m| m.as_str()).collect();
        modes.sort_unstable();
        modes.dedup();
        if modes.len() != caps.pause_modes.len() {
            return Err(Failure::new(rule, "a pause mode is declared twice"));
        }
        let health = ok(h.engine.health(), "health", "health")?;
        let stats = ok(h.engine.stats(), "stats", "stats")?;
        if health.weight_version != stats.weight_version {
            return Err(Failure::new(
                "one weight version",
                format!(
                    "health says version {} and stats {}",
                    health.weight_version, stats.weight_version
                ),
            ));
        }
        Ok(())
    }

    /// Greedy generation: one completion per prompt, at most `max_tokens`, a logprob per
    /// token when asked, the served version, and the same tokens twice.
    pub fn generate_is_well_formed(h: &mut EngineHarness) -> Outcome {
        let rule = "generate answers every prompt";
        let a = h.generate(rule)?;
        let b = h.generate(rule)?;
        let req = h.greedy();
        if a.completions.len() != req.prompts.len() {
            return Err(Failure::new(
                rule,
                format!(
                    "{} prompts, {} completions",
                    req.prompts.len(),
                    a.completions.len()
                ),
            ));
        }
        for (i, c) in a.completions.iter().enumerate() {
            if c.tokens.len() > req.sampling.max_tokens as usize {
                return Err(Failure::new(
                    "max_tokens is respected",
                    format!("completion {i} has {} tokens", c.tokens.len()),
                ));
            }
            if c.logprobs.len() != c.tokens.len() {
                return Err(Failure::new(
                    "a logprob per token when asked",
                    format!(
                        "completion {i}: {} tokens, {} logprobs",
                        c.tokens.len(),
                        c.logprobs.len()
                    ),
                ));
            }
            if c.logprobs.iter().any(|l| !l.is_finite() || *l > 1e-6) {
                return Err(Failure::new(
                    "a logprob per token when asked",
                    format!("completion {i}: logprobs {:?} are not <= 0", c.logprobs),
                ));
            }
        }
        let tokens = |r: &GenerateResponse| -> Vec<Vec<u32>> {
            r.completions.iter().map(|c| c.tokens.to_vec()).collect()
        };
        if tokens(&a) != tokens(&b) {
            return Err(Failure::new(
                "greedy generation is deterministic",
                format!("{:?} then {:?}", tokens(&a), tokens(&b)),
            ));
        }
        let version = ok(h.engine.health(), "health", "health")?.weight_version;
        if a.weight_version != version {
            return Err(Failure::new(
                "one weight version",
                format!(
                    "generate says version {}, health {version}",
                    a.weight_version
                ),
            ));
        }
        Ok(())
    }

    /// `score` of prompt + completion gives the completion's logprobs `generate` returned
    /// (or `score` is not supported at all).
    pub fn score_agrees_with_generate(h: &mut EngineHarness) -> Outcome {
        let rule = "score agrees with generate's logprobs";
        let out = h.generate(rule)?;
        let seqs: RVec<RVec<u32>> = h
            .greedy()
            .prompts
            .iter()
            .zip(out.completions.iter())
            .map(|(p, c)| p.iter().chain(c.tokens.iter()).copied().collect())
            .collect();
        let scores = match h.engine.score(seqs.clone()) {
            RResult::RErr(e) if e.code == ErrorCode::NotSupported => return Ok(()),
            r => ok(r, rule, "score")?,
        };
        for (i, ((s, c), seq)) in scores
            .iter()
            .zip(out.completions.iter())
            .zip(&seqs)
            .enumerate()
        {
            if s.len() + 1 != seq.len() {
                return Err(Failure::new(
                    rule,
                    format!(
                        "sequence {i} of {} tokens got {} scores (one per token after the first)",
                        seq.len(),
                        s.len()
                    ),
                ));
            }
            let tail = &s[s.len() - c.tokens.len()..];
            for (j, (a, b)) in tail.iter().zip(c.logprobs.iter()).enumerate() {
                if (a - b).abs() > h.setup.tolerance {
                    return Err(Failure::new(
                        rule,
                        format!(
                            "sequence {i} token {j}: score {a} vs generate {b} (tolerance {})",
                            h.setup.tolerance
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Each declared pause mode stops generation until `continue_generation`; undeclared
    /// modes answer `NotSupported` and leave the engine serving.
    pub fn pause_modes(h: &mut EngineHarness) -> Outcome {
        let declared = h.decl.caps.pause_modes.clone();
        for mode in ALL_MODES {
            if declared.contains(&mode) {
                ok(
                    h.step(EngineOp::Pause, mode),
                    "declared pause modes work",
                    &format!("pause_generation({})", mode.as_str()),
                )?;
                let e = refused(
                    h.engine.generate(h.greedy()),
                    "no generation while paused",
                    &format!("generate after pause_generation({})", mode.as_str()),
                )?;
                if e.code != ErrorCode::InvalidState {
                    return Err(Failure::new(
                        "no generation while paused",
                        format!(
                            "generate while paused must be invalid_state, got {}",
                            one(&e)
                        ),
                    ));
                }
                if ok(h.engine.health(), "health", "health")?.ready {
                    return Err(Failure::new(
                        "a paused engine is not ready",
                        "health says ready while paused",
                    ));
                }
                ok(
                    h.step(EngineOp::Continue, mode),
                    "declared pause modes work",
                    "continue_generation",
                )?;
                h.generate("generation resumes after continue")?;
            } else {
                not_supported(
                    h.engine.pause_generation(mode),
                    &format!("pause_generation({})", mode.as_str()),
                )?;
                h.generate("an undeclared pause mode changes nothing")?;
            }
        }
        Ok(())
    }

    /// Each declared releasable tag is released (its resident memory goes down when it lives
    /// in host regions) and resumed bit-exact: greedy tokens and logprobs are unchanged.
    /// Undeclared tags are refused.
    pub fn release_and_resume(h: &mut EngineHarness) -> Outcome {
        let rule = "declared tags release and resume bit-exact";
        let Some(mode) = h.pause_mode() else {
            let tags: RVec<RString> = RVec::from(vec![RString::from("kv_cache")]);
            refused(
                h.engine.release_memory(tags),
                "no release without pause",
                "release_memory on an engine that declares no pause mode",
            )?;
            return Ok(());
        };
        let before = h.generate(rule)?;
        for tag in h.decl.caps.releasable_tags.clone() {
            let set: tandem_plugin_api::lifecycle::Tags =
                std::iter::once(tag.to_string()).collect();
            ok(h.step(EngineOp::Pause, mode), rule, "pause_generation")?;
            let resident = h.resident_bytes();
            ok(
                h.step(EngineOp::Release(set.clone()), mode),
                rule,
                &format!("release_memory([{tag}])"),
            )?;
            let after = h.resident_bytes();
            if resident > 0 && after >= resident {
                return Err(Failure::new(
                    "release frees memory",
                    format!("releasing `{tag}`: resident host memory {resident} -> {after} bytes"),
                ));
            }
            ok(
                h.step(EngineOp::Resume(set), mode),
                rule,
                &format!("resume_memory([{tag}])"),
            )?;
            ok(
                h.step(EngineOp::Continue, mode),
                rule,
                "continue_generation",
            )?;
            let again = h.generate(rule)?;
            if again.completions != before.completions {
                return Err(Failure::new(
                    rule,
                    format!("after releasing and resuming `{tag}` the greedy output changed"),
                ));
            }
        }
        let undeclared: Vec<&str> = tandem_plugin_api::tags::ALL
            .into_iter()
            .filter(|t| !h.decl.caps.releasable_tags.iter().any(|d| d == t))
            .collect();
        ok(h.step(EngineOp::Pause, mode), rule, "pause_generation")?;
        for t in undeclared {
            refused(
                h.engine.release_memory(RVec::from(vec![RString::from(t)])),
                "undeclared tags are refused",
                &format!("release_memory([{t}]) of an undeclared tag"),
            )?;
        }
        Ok(())
    }

    /// Update kinds and adapters the engine does not declare answer `NotSupported`.
    pub fn undeclared_updates(h: &mut EngineHarness) -> Outcome {
        use tandem_plugin_api::{SharedRegionRef, UpdateKind};
        let caps = h.decl.caps.clone();
        if let Some(mode) = h.pause_mode() {
            ok(h.step(EngineOp::Pause, mode), "pause", "pause_generation")?;
        }
        let payloads = [
            UpdatePayload::SharedRegion {
                region: SharedRegionRef {
                    key: "memfd:0:0:0:0".into(),
                    device: "cpu".into(),
                    len: 0,
                },
                tensors: RVec::new(),
            },
            UpdatePayload::Adapter {
                name: "conformance".into(),
                dir: "/nonexistent".into(),
            },
            UpdatePayload::CheckpointDir {
                dir: "/nonexistent".into(),
            },
            UpdatePayload::TensorBuckets {
                group: "conformance".into(),
                buckets: RVec::new(),
            },
        ];
        let version = h.machine.version() + 1;
        for payload in payloads {
            let kind: UpdateKind = payload.kind();
            if caps.update_kinds.contains(&kind) {
                continue;
            }
            not_supported(
                h.engine.apply_weight_update(WeightUpdate {
                    version,
                    payload,
                    digest: RString::new(),
                }),
                &format!("apply_weight_update({})", kind.as_str()),
            )?;
        }
        if !caps.lora {
            not_supported(
                h.engine
                    .load_adapter("conformance".into(), "/nonexistent".into()),
                "load_adapter (the engine declares no lora)",
            )?;
        }
        Ok(())
    }

    /// Random lifecycle sequences are accepted or refused exactly as the state machine says.
    pub fn follows_the_state_machine(h: &mut EngineHarness) -> Outcome {
        crate::oracle::run(h)
    }
}
