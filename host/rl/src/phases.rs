//! The drained offload and the staged onload across every engine, with each engine's state
//! machine checked before a call is made and the event log written after it returns.
//!
//! Drained offload: `pause_generation` on every engine and wait for all of them, then
//! `flush_cache` on every engine, then `release_memory` on every engine whose group has
//! `needs_offload = true`. Staged onload: the weights back on every engine, then the sync
//! (the caller's), then the KV cache, then `continue_generation`. Each stage runs on all
//! engines in parallel and completes on all of them before the next stage starts.
//!
//! A rank whose rollout share is done may be drained on its own while others still generate
//! (a drafter's bubble, [`drain_one`]): pause → flush → release of the run's tags other than
//! the weights; the loop commits those transitions ([`Engines::commit_drain`]) and the drained
//! offload then takes each engine from the state it is in.

use super::events::EventLog;
use crate::error::RlError;
use tandem_plugin_api::PauseMode;
use tandem_plugin_api::tags::{KV_CACHE, WEIGHTS};
use tandem_runtime::RuntimeError;
use tandem_runtime::launch::RemoteEngine;
use tandem_runtime::orchestrator::{EngineMachine, EngineOp, EngineState};

/// The engines of a run and what the controller knows of each.
pub struct Engines {
    /// The remote handles, by rank.
    pub remotes: Vec<RemoteEngine>,
    /// Each engine's state machine.
    pub machines: Vec<EngineMachine>,
    /// Whether the drained offload releases each engine's memory.
    pub needs_offload: bool,
    /// Tags the drained offload releases (from the bridge).
    pub release_tags: Vec<String>,
}

/// One stage: the state-machine operation and the event it logs (`label`, `detail`).
struct Stage<'a> {
    op: EngineOp,
    label: &'a str,
    detail: &'a str,
}

impl<'a> Stage<'a> {
    fn new(op: EngineOp, label: &'a str, detail: &'a str) -> Stage<'a> {
        Stage { op, label, detail }
    }
}

/// Engine rank `rank`'s name in events.
pub(crate) fn name(rank: usize) -> String {
    format!("engine-{rank}")
}

fn illegal(rank: usize, e: impl std::fmt::Display) -> RlError {
    RlError::failed(format!("engine rank {rank}: {e}"))
}

impl Engines {
    /// Checks `op` on every machine first (so nothing is called when one would be illegal),
    /// runs `call` on every engine, then commits the transitions of the engines whose call
    /// succeeded (so each machine follows its engine when another engine's worker died) and
    /// logs one event each; the first failure (by rank) is returned.
    fn stage(
        &mut self,
        events: &EventLog,
        step: u32,
        what: Stage<'_>,
        call: impl Fn(&RemoteEngine) -> Result<(), RuntimeError> + Sync,
    ) -> Result<(), RlError> {
        let every = vec![true; self.machines.len()];
        self.stage_where(events, step, what, &every, call)
    }

    /// [`Engines::stage`] on the ranks `which` selects only.
    fn stage_where(
        &mut self,
        events: &EventLog,
        step: u32,
        what: Stage<'_>,
        which: &[bool],
        call: impl Fn(&RemoteEngine) -> Result<(), RuntimeError> + Sync,
    ) -> Result<(), RlError> {
        let picked = |rank: usize| which.get(rank).copied().unwrap_or(false);
        for (rank, m) in self.machines.iter().enumerate().filter(|(r, _)| picked(*r)) {
            m.clone()
                .apply(what.op.clone())
                .map_err(|e| illegal(rank, e))?;
        }
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .remotes
                .iter()
                .enumerate()
                .map(|(rank, e)| {
                    let call = &call;
                    picked(rank).then(|| s.spawn(move || call(e).map_err(RlError::from)))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(RlError::failed("an engine call panicked")))
                    })
                })
                .collect::<Vec<_>>()
        });
        let mut first = None;
        for (rank, (m, r)) in self.machines.iter_mut().zip(results).enumerate() {
            let Some(r) = r else { continue };
            match r {
                Ok(()) => {
                    m.apply(what.op.clone()).map_err(|e| illegal(rank, e))?;
                    events.record(step, &name(rank), what.label, what.detail);
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Tags this run releases on the engines, split into weights and the rest (KV cache...).
    fn split_tags(&self) -> (Vec<String>, Vec<String>) {
        if !self.needs_offload {
            return (Vec::new(), Vec::new());
        }
        self.release_tags
            .iter()
            .cloned()
            .partition(|t| t == WEIGHTS)
    }

    /// Drained offload: pause all → flush all → release all (when `needs_offload`), each
    /// engine from the state it is in (a rank drained in a bubble is already released).
    pub fn drained_offload(&mut self, events: &EventLog, step: u32) -> Result<(), RlError> {
        let serving = self.in_state(&EngineState::Serving);
        if serving.contains(&true) {
            self.stage_where(
                events,
                step,
                Stage::new(EngineOp::Pause, "pause", "wait"),
                &serving,
                |e| e.pause_generation(PauseMode::Wait),
            )?;
        }
        let paused = self.in_state(&EngineState::Paused);
        if paused.contains(&true) {
            self.stage_where(
                events,
                step,
                Stage::new(EngineOp::Flush, "flush", ""),
                &paused,
                |e| e.flush_cache(),
            )?;
        }
        if !self.needs_offload || self.release_tags.is_empty() {
            return Ok(());
        }
        // What each engine still holds of the tags (all of them unless drained in a bubble),
        // released together per distinct set.
        let missing: Vec<Vec<String>> = self
            .machines
            .iter()
            .map(|m| {
                let held = m.released();
                self.release_tags
                    .iter()
                    .filter(|t| !held.contains(*t))
                    .cloned()
                    .collect()
            })
            .collect();
        let mut sets: Vec<Vec<String>> = missing.clone();
        sets.sort();
        sets.dedup();
        for tags in sets.into_iter().filter(|t| !t.is_empty()) {
            let which: Vec<bool> = missing.iter().map(|m| *m == tags).collect();
            let op = EngineOp::Release(tags.iter().cloned().collect());
            let detail = tags.join(",");
            self.stage_where(
                events,
                step,
                Stage::new(op, "release", &detail),
                &which,
                |e| e.release_memory(&tags),
            )?;
        }
        Ok(())
    }

    /// Which engines are in state `s`, by rank.
    fn in_state(&self, s: &EngineState) -> Vec<bool> {
        self.machines.iter().map(|m| m.state() == s).collect()
    }

    /// The tags a rank drained in a bubble releases: the run's release tags but the weights
    /// (the sync needs them), when the run releases memory at all.
    pub fn drain_tags(&self) -> Vec<String> {
        self.split_tags().1
    }

    /// Commits what [`drain_one`] did to rank `rank`'s engine (`ops`, in order) to its machine.
    pub fn commit_drain(&mut self, rank: usize, ops: &[EngineOp]) -> Result<(), RlError> {
        let m = self
            .machines
            .get_mut(rank)
            .ok_or_else(|| RlError::failed(format!("no engine rank {rank}")))?;
        for op in ops {
            m.apply(op.clone()).map_err(|e| illegal(rank, e))?;
        }
        Ok(())
    }

    /// First stage of the onload: the weights (before the sync).
    pub fn onload_weights(&mut self, events: &EventLog, step: u32) -> Result<(), RlError> {
        let (weights, _) = self.split_tags();
        self.resume(events, step, weights)
    }

    /// Third stage of the onload: everything else released (KV cache), after the sync.
    pub fn onload_rest(&mut self, events: &EventLog, step: u32) -> Result<(), RlError> {
        let (_, rest) = self.split_tags();
        self.resume(events, step, rest)
    }

    fn resume(&mut self, events: &EventLog, step: u32, tags: Vec<String>) -> Result<(), RlError> {
        // Only what each engine has released (a restarted engine has everything resident).
        let released = self.machines.iter().any(|m| {
            let r = m.released();
            tags.iter().any(|t| r.contains(t))
        });
        if tags.is_empty() || !released {
            return Ok(());
        }
        let op = EngineOp::Resume(tags.iter().cloned().collect());
        let label = if tags.iter().any(|t| t == KV_CACHE) && !tags.iter().any(|t| t == WEIGHTS) {
            "resume_kv"
        } else {
            "resume"
        };
        let detail = tags.join(",");
        self.stage(events, step, Stage::new(op, label, &detail), |e| {
            e.resume_memory(&tags)
        })
    }

    /// Last stage: `continue_generation` on every paused engine.
    pub fn continue_all(&mut self, events: &EventLog, step: u32) -> Result<(), RlError> {
        if self.machines.iter().all(EngineMachine::can_generate) {
            return Ok(());
        }
        self.stage(
            events,
            step,
            Stage::new(EngineOp::Continue, "continue", ""),
            |e| e.continue_generation(),
        )
    }

    /// Brings every engine back to generating, each from the state it is in (after a
    /// recovery the survivors may be paused or released mid-step, a restarted engine serves):
    /// whatever it released comes back, then `continue_generation`.
    pub fn bring_back(&mut self, events: &EventLog, step: u32) -> Result<(), RlError> {
        for rank in 0..self.remotes.len() {
            let e = &self.remotes[rank];
            let released: Vec<String> = self.machines[rank].released().into_iter().collect();
            if !released.is_empty() {
                let op = EngineOp::Resume(released.iter().cloned().collect());
                self.machines[rank]
                    .clone()
                    .apply(op.clone())
                    .map_err(|x| illegal(rank, x))?;
                e.resume_memory(&released)?;
                self.machines[rank]
                    .apply(op)
                    .map_err(|x| illegal(rank, x))?;
                events.record(step, &name(rank), "resume", &released.join(","));
            }
            if !self.machines[rank].can_generate() {
                let op = EngineOp::Continue;
                self.machines[rank]
                    .clone()
                    .apply(op.clone())
                    .map_err(|x| illegal(rank, x))?;
                e.continue_generation()?;
                self.machines[rank]
                    .apply(op)
                    .map_err(|x| illegal(rank, x))?;
                events.record(step, &name(rank), "continue", "");
            }
        }
        Ok(())
    }

    /// Puts a new engine (a fresh process serving `version`) in rank `rank`'s place.
    pub fn replace(&mut self, rank: usize, engine: RemoteEngine, version: u64) {
        self.remotes[rank] = engine;
        self.machines[rank] = EngineMachine::new(version);
    }

    /// The lowest version any engine serves (0 without engines).
    pub fn min_version(&self) -> u64 {
        self.machines
            .iter()
            .map(EngineMachine::version)
            .min()
            .unwrap_or(0)
    }

    /// Marks every engine as applying `version` (checked) before a sync.
    pub fn begin_update(&mut self, version: u64) -> Result<(), RlError> {
        for (rank, m) in self.machines.iter_mut().enumerate() {
            m.apply(EngineOp::BeginUpdate(version))
                .map_err(|e| illegal(rank, e))?;
        }
        Ok(())
    }

    /// After a sync: applied (or restarted: a fresh engine serving `version`).
    pub fn end_update(&mut self, restarted: bool, version: u64) -> Result<(), RlError> {
        for (rank, m) in self.machines.iter_mut().enumerate() {
            if restarted {
                *m = EngineMachine::new(version);
            } else {
                m.apply(EngineOp::EndUpdate).map_err(|e| illegal(rank, e))?;
            }
        }
        Ok(())
    }

    /// After a failed sync: the old weights stay.
    pub fn abort_update(&mut self) {
        for m in &mut self.machines {
            let _ = m.apply(EngineOp::AbortUpdate);
        }
    }
}

/// Drains one engine whose share is done (pause → flush → release `tags`), logging each call
/// as the drained offload does (detail `bubble`); the operations that succeeded, in order, for
/// [`Engines::commit_drain`]. A failure stops the drain there (the engine's own error, which
/// the rollout or the drained offload reports).
pub fn drain_one(
    engine: &RemoteEngine,
    rank: usize,
    tags: &[String],
    events: &EventLog,
    step: u32,
) -> Vec<EngineOp> {
    let mut done = Vec::new();
    let release = EngineOp::Release(tags.iter().cloned().collect());
    for (op, label) in [
        (EngineOp::Pause, "pause"),
        (EngineOp::Flush, "flush"),
        (release, "release"),
    ] {
        let called = match &op {
            EngineOp::Pause => engine.pause_generation(PauseMode::Wait),
            EngineOp::Flush => engine.flush_cache(),
            _ => engine.release_memory(tags),
        };
        if let Err(e) = called {
            tracing::warn!("engine rank {rank}: its drain in the bubble stopped at {label}: {e}");
            break;
        }
        let detail = match &op {
            EngineOp::Release(_) => format!("{} (bubble)", tags.join(",")),
            _ => "bubble".to_string(),
        };
        events.record(step, &name(rank), label, &detail);
        done.push(op);
    }
    done
}
