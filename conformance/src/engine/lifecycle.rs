//! Engine checks of the lifecycle: pause modes, memory release and resume, undeclared updates,
//! and random sequences against the state machine.

use super::EngineHarness;
use crate::expect::{not_supported, ok, one, refused};
use crate::harness::{Failure, Outcome};
use tandem_plugin_api::lifecycle::EngineOp;
use tandem_plugin_api::{ErrorCode, PauseMode, RString, RVec, UpdatePayload, WeightUpdate};

/// Every pause mode the ABI knows.
const ALL_MODES: [PauseMode; 3] = [PauseMode::Abort, PauseMode::Wait, PauseMode::Keep];

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
        let set: tandem_plugin_api::lifecycle::Tags = std::iter::once(tag.to_string()).collect();
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
