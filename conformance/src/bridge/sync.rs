//! A sync through the bridge, as the host runs one (API level 7 calls; a level-4 bridge
//! through their defaults), twice: the trainer trains a step and exports the bridge's first
//! kind, the trainer half `ship`s it, and the engine half's `receive` + the engine take it
//! (an update the engine applies, or tensors decoded into the services' sink) — while the
//! trainer half's `transmit` runs on another thread when the plan asks for a transport (over
//! the in-process world of `world.rs`). Both halves learn each outcome (`after_apply`) and
//! answer `stats`. With digests, a third sync fails at the engine (a digest no weights have)
//! and a fourth must then go through: a bridge that keeps state or buffers across syncs
//! recovers from a failed apply.
//!
//! A plan that asks for engine restarts (`restart_engines`: a new engine process on each
//! shipped checkpoint) cannot be followed here, where only the host owns processes: the
//! engine applies the shipped update in place instead (the native engine reloads a checkpoint
//! directory in place), which checks the same halves and the same weights.

use super::{construct, declared, kinds, load, plan, world};
use crate::engine::EngineHarness;
use crate::expect::ok;
use crate::harness::{Failure, Outcome};
use crate::pair::engine_logprobs;
use crate::setup::{BridgeSetup, EngineSetup, TrainerSetup};
use crate::trainer::{TrainerHarness, max_diff};
use tandem_plugin_api::lifecycle::EngineOp;
use tandem_plugin_api::{
    ApplyOutcome, BridgeBox, BridgePlan, ComponentKind, Shipment, UpdateKind, UpdateReport,
    WeightUpdate,
};
use tandem_services::decoded;

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

/// The engine half on `shipped` (`receive`, its engine taking what it handed over through
/// the services' sink, as a worker runs it; paused, as the host does), then the half learns
/// the outcome (`after_apply`). The engine's report, or its error as a failure of `rule`.
fn engine_half(
    bridge: &Bridge,
    e: &mut EngineHarness,
    shipped: Shipment,
    rule: &'static str,
) -> Result<UpdateReport, Failure> {
    let Some(mode) = e.pause_mode() else {
        return Err(Failure::new(
            rule,
            "the engine declares update kinds but no pause mode to apply them in",
        ));
    };
    ok(e.step(EngineOp::Pause, mode), rule, "pause_generation")?;
    let version = shipped.version;
    let received = decoded::receive(&bridge.engine, &e.engine, &e.services, shipped);
    ok(
        bridge.engine.after_apply(ApplyOutcome {
            version,
            applied: received.is_ok(),
        }),
        "a bridge half takes the outcome of an apply",
        "after_apply (engine half)",
    )?;
    let report = received.map_err(|err| {
        Failure::new(
            rule,
            format!("receive, then the engine's apply of version {version}: {err}"),
        )
    });
    if report.is_ok() {
        e.advance(EngineOp::BeginUpdate(version));
    }
    ok(
        e.step(EngineOp::Continue, mode),
        rule,
        "continue_generation",
    )?;
    report
}

/// The shipment reaches the engine: alone, or while the trainer half transmits.
fn deliver(
    bridge: &Bridge,
    e: &mut EngineHarness,
    shipped: &Shipment,
    to_engine: Shipment,
    rule: &'static str,
) -> Result<UpdateReport, Failure> {
    if !bridge.plan.transport {
        return engine_half(bridge, e, to_engine, rule);
    }
    let (sent, applied) = std::thread::scope(|s| {
        let sender = s.spawn(|| bridge.trainer.transmit(shipped.clone()));
        let applied = engine_half(bridge, e, to_engine, rule);
        let sent = sender.join();
        (sent, applied)
    });
    // The engine's failure first: a sender's is usually its consequence.
    let report = applied?;
    match sent {
        Err(_) => Err(Failure::new(
            "no panic",
            "the trainer half's `transmit` panicked",
        )),
        Ok(r) => ok(r, "the trainer half transmits what it shipped", "transmit").map(|()| report),
    }
}

/// A train step, the trainer's export and the trainer half's shipment of it (checked to
/// carry the trainer's version and digest).
fn export_and_ship(
    bridge: &Bridge,
    t: &mut TrainerHarness,
    rule: &'static str,
) -> Result<(WeightUpdate, Shipment), Failure> {
    t.train(rule)?;
    let first = bridge.first;
    let exported = ok(
        t.trainer.export_weight_update(first),
        "declared exports work",
        &format!("export_weight_update({})", first.as_str()),
    )?;
    let shipped = ok(
        bridge.trainer.ship(exported.clone()),
        "the trainer half ships the trainer's export",
        "ship",
    )?;
    if shipped.version != exported.version || shipped.digest != exported.digest {
        return Err(Failure::new(
            "the bridge ships the trainer's version and digest",
            format!(
                "the trainer exported version {} ({}), the trainer half shipped {} ({})",
                exported.version, exported.digest, shipped.version, shipped.digest
            ),
        ));
    }
    if let Some(update) = shipped.to_update() {
        let kind = update.payload.kind();
        if kind != bridge.last && kind != first {
            return Err(Failure::new(
                "the trainer half ships one of the bridge's kinds",
                format!(
                    "ship returned a `{}` update; the bridge declares `{}` and `{}`",
                    kind.as_str(),
                    first.as_str(),
                    bridge.last.as_str()
                ),
            ));
        }
    }
    Ok((exported, shipped))
}

/// Both halves' `stats()` answer, with named, finite figures.
fn stats_answer(bridge: &Bridge) -> Outcome {
    let rule = "a bridge's stats are named finite figures";
    for (side, half) in [("trainer", &bridge.trainer), ("engine", &bridge.engine)] {
        let figures = ok(half.stats(), rule, &format!("stats ({side} half)"))?;
        let mut seen = std::collections::BTreeSet::new();
        for m in figures.iter() {
            if m.name.is_empty() || !m.value.is_finite() || !seen.insert(m.name.to_string()) {
                return Err(Failure::new(
                    rule,
                    format!(
                        "the {side} half reports `{}` = {} (names must be unique and \
                         non-empty, values finite)",
                        m.name, m.value
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// One sync after a train step; the engine serves the shipped version, the trainer's digest
/// and the trainer's logprobs; both halves learn the outcome and answer their stats.
/// Returns the version.
fn sync(bridge: &Bridge, e: &mut EngineHarness, t: &mut TrainerHarness) -> Result<u64, Failure> {
    let (exported, shipped) = export_and_ship(bridge, t, RULE)?;
    let report = deliver(bridge, e, &shipped, shipped.clone(), RULE);
    ok(
        bridge.trainer.after_apply(ApplyOutcome {
            version: shipped.version,
            applied: report.is_ok(),
        }),
        "a bridge half takes the outcome of an apply",
        "after_apply (trainer half)",
    )?;
    let report = report?;
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
    stats_answer(bridge)?;
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

/// A sync whose apply fails at the engine — its shipment reaches the engine with a digest
/// no weights have, so the engine refuses after taking every byte — then both halves learn
/// it failed.
fn failed_sync(bridge: &Bridge, e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
    let rule = "an engine refuses weights whose digest differs";
    let (_, shipped) = export_and_ship(bridge, t, RULE)?;
    let mut damaged = shipped.clone();
    damaged.digest = format!("st256:0:{}", "0".repeat(64)).into();
    let report = deliver(bridge, e, &shipped, damaged, rule);
    ok(
        bridge.trainer.after_apply(ApplyOutcome {
            version: shipped.version,
            applied: false,
        }),
        "a bridge half takes the outcome of an apply",
        "after_apply (trainer half, failed)",
    )?;
    match report {
        Ok(r) => Err(Failure::new(
            rule,
            format!(
                "the engine applied version {} shipped with a digest no weights have \
                 (it reports {})",
                r.version, r.digest
            ),
        )),
        Err(_) => Ok(()),
    }
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
        if engine.setup.digests {
            failed_sync(&bridge, &mut engine, &mut trainer)?;
            sync(&bridge, &mut engine, &mut trainer)?;
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
