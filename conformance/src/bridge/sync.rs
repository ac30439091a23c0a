//! A sync through the bridge, as the host runs one, twice: the trainer trains a step and
//! exports the bridge's first kind, the trainer half ships it, and the engine half + the
//! engine's `apply_weight_update` take it — while the trainer half's `send` runs on another
//! thread when the plan asks for a transport (over the in-process world of `world.rs`).
//!
//! A plan that asks for engine restarts (`restart_engines`: a new engine process on each
//! shipped checkpoint) cannot be followed here, where only the host owns processes: the
//! engine applies the shipped update in place instead (the native engine reloads a checkpoint
//! directory in place), which checks the same halves and the same weights.

use super::{construct, declared, kinds, load, plan, world};
use crate::engine::EngineHarness;
use crate::expect::ok;
use crate::harness::{Failure, Outcome};
use crate::pair::{apply, engine_logprobs};
use crate::setup::{BridgeSetup, EngineSetup, TrainerSetup};
use crate::trainer::{TrainerHarness, max_diff};
use tandem_plugin_api::{
    BridgeBox, BridgePlan, ComponentKind, UpdateKind, UpdateReport, WeightUpdate,
};

const RULE: &str = "the engine serves the trainer's weights through the bridge";

/// The bridge's instances (trainer half, engine half), its plan and kinds.
struct Bridge {
    trainer: BridgeBox,
    engine: BridgeBox,
    plan: BridgePlan,
    first: UpdateKind,
    last: UpdateKind,
}

/// The engine must apply the bridge's last kind and the trainer export its first (within the
/// setup's `kinds`); otherwise the pair cannot carry this bridge and the suite must say so.
fn speaks(e: &EngineSetup, t: &TrainerSetup, first: UpdateKind, last: UpdateKind) -> Outcome {
    let rule = "the engine and trainer take the bridge's kinds";
    let engine = declared(&e.source, ComponentKind::Engine, &e.component)?;
    let trainer = declared(&t.source, ComponentKind::Trainer, &t.component)?;
    let exports = trainer.caps.update_kinds.contains(&first)
        && t.kinds.as_ref().is_none_or(|only| only.contains(&first));
    let missing = if !exports {
        Some(format!(
            "trainer `{}` with these options does not export `{}`",
            t.component,
            first.as_str()
        ))
    } else if !engine.caps.update_kinds.contains(&last) {
        Some(format!(
            "engine `{}` does not apply `{}`",
            e.component,
            last.as_str()
        ))
    } else {
        None
    };
    match missing {
        Some(why) => Err(Failure::new(
            rule,
            format!(
                "{why}: give the suite an engine and trainer that do, or mark it \
                 `ignore: \"why\"`"
            ),
        )),
        None => Ok(()),
    }
}

/// The engine half, then the engine applies what it returned (paused, as the host does).
fn engine_half(
    bridge: &Bridge,
    e: &mut EngineHarness,
    shipped: WeightUpdate,
) -> Result<UpdateReport, Failure> {
    let update = ok(
        bridge.engine.engine_side(shipped),
        "the engine half takes what the trainer half shipped",
        "engine_side",
    )?;
    let kind = update.payload.kind();
    if kind != bridge.last {
        return Err(Failure::new(
            "the engine half hands the engine the bridge's last kind",
            format!(
                "engine_side returned a `{}` update; the bridge declares `{}`",
                kind.as_str(),
                bridge.last.as_str()
            ),
        ));
    }
    apply(e, update)
}

/// The shipped update reaches the engine: alone, or while the trainer half sends.
fn ship(
    bridge: &Bridge,
    e: &mut EngineHarness,
    shipped: &WeightUpdate,
) -> Result<UpdateReport, Failure> {
    if !bridge.plan.transport {
        return engine_half(bridge, e, shipped.clone());
    }
    let (sent, applied) = std::thread::scope(|s| {
        let sender = s.spawn(|| bridge.trainer.send(shipped.clone()));
        let applied = engine_half(bridge, e, shipped.clone());
        let sent = sender.join();
        (sent, applied)
    });
    // The engine's failure first: a sender's is usually its consequence.
    let report = applied?;
    match sent {
        Err(_) => Err(Failure::new(
            "no panic",
            "the trainer half's `send` panicked",
        )),
        Ok(r) => ok(r, "the trainer half sends what it shipped", "send").map(|()| report),
    }
}

/// One sync after a train step; the engine serves the shipped version, the trainer's digest
/// and the trainer's logprobs. Returns the version.
fn sync(bridge: &Bridge, e: &mut EngineHarness, t: &mut TrainerHarness) -> Result<u64, Failure> {
    t.train(RULE)?;
    let first = bridge.first;
    let exported = ok(
        t.trainer.export_weight_update(first),
        "declared exports work",
        &format!("export_weight_update({})", first.as_str()),
    )?;
    let shipped = ok(
        bridge.trainer.trainer_side(exported.clone()),
        "the trainer half ships the trainer's export",
        "trainer_side",
    )?;
    if shipped.version != exported.version {
        return Err(Failure::new(
            "the bridge ships the trainer's version",
            format!(
                "the trainer exported version {}, the trainer half shipped {}",
                exported.version, shipped.version
            ),
        ));
    }
    let report = ship(bridge, e, &shipped)?;
    let served = ok(e.engine.health(), "health", "health")?.weight_version;
    if report.version != shipped.version || served != shipped.version {
        return Err(Failure::new(
            "the engine serves the shipped version",
            format!(
                "shipped version {}: the engine's report says {}, its health {served}",
                shipped.version, report.version
            ),
        ));
    }
    if e.setup.digests && !exported.digest.is_empty() && report.digest != exported.digest {
        return Err(Failure::new(
            "digests agree",
            format!(
                "trainer digest {}, engine digest {}",
                exported.digest, report.digest
            ),
        ));
    }
    let want = t.logprobs(RULE)?;
    let got = engine_logprobs(e, t)?;
    let d = max_diff(&want, &got);
    if d > e.setup.tolerance {
        return Err(Failure::new(
            RULE,
            format!(
                "version {}: engine and trainer logprobs differ by {d} (tolerance {})",
                shipped.version, e.setup.tolerance
            ),
        ));
    }
    Ok(shipped.version)
}

/// Two syncs, each after a train step: each time the engine reports the shipped version and
/// (when the trainer exported one and the engine setup has digests) the trainer's digest,
/// and serves the trainer's logprobs within the engine setup's tolerance; the second version
/// is above the first. The bridge's trainer half gets the trainer's services (rank 0 of the
/// group `bridge` when the plan asks for a transport), its engine half the engine's (rank 1);
/// both share a run directory. A `restart_engines` plan is applied in place (see the module
/// doc). Fails, saying so, when the engine or trainer does not take the bridge's kinds.
pub fn syncs_twice(b: &BridgeSetup, e: &EngineSetup, t: &TrainerSetup) -> Outcome {
    let (module, decl) = load(b)?;
    let (first, last) = kinds(&decl)?;
    speaks(e, t, first, last)?;
    let run_dir = tempfile::tempdir()
        .map_err(|e| Failure::new("setup", format!("creating a run dir: {e}")))?;
    let probe = construct(
        b,
        module,
        &t.model,
        run_dir.path(),
        tandem_services::Services::new().handle(),
    )?;
    let planned = plan(&probe)?;
    drop(probe);
    let world = if planned.transport {
        Some(world::bridge_world()?)
    } else {
        None
    };
    let (t_groups, e_groups) = match world.as_ref() {
        Some(w) => (Some(w.trainer.clone()), Some(w.engine.clone())),
        None => (None, None),
    };
    let mut trainer = TrainerHarness::with_transport(t.clone(), t_groups)?;
    let mut engine = EngineHarness::with_transport(e.clone(), e_groups)?;
    let outcome = (|| {
        let bridge = Bridge {
            trainer: construct(
                b,
                module,
                &t.model,
                run_dir.path(),
                trainer.services.handle(),
            )?,
            engine: construct(
                b,
                module,
                &t.model,
                run_dir.path(),
                engine.services.handle(),
            )?,
            plan: planned,
            first,
            last,
        };
        let v1 = sync(&bridge, &mut engine, &mut trainer)?;
        let v2 = sync(&bridge, &mut engine, &mut trainer)?;
        if v2 <= v1 {
            return Err(Failure::new(
                "versions go up",
                format!("the second sync shipped version {v2} after {v1}"),
            ));
        }
        Ok(())
    })();
    if let Err(f) = outcome {
        let kept = [engine.keep_run_dir(), trainer.keep_run_dir()];
        let dirs: Vec<String> = kept
            .iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        return Err(Failure::new(
            f.rule,
            format!(
                "{} (run dirs, with logs, kept: {})",
                f.detail,
                dirs.join(", ")
            ),
        ));
    }
    Ok(())
}
