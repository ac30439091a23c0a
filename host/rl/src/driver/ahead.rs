//! Asynchronous RL (`[algorithm] max_staleness = k`, k ≥ 1): the next step's rollout is
//! generated while this step trains, and the weights reach the engines only as often as the
//! bound needs.
//!
//! A step of an asynchronous run:
//!
//! ```text
//!  take the rollout generated ahead (or generate it, the first step or after a failure)
//!  start the next step's rollout on its own thread ─┐  engines: generate step n + 1
//!  batch (+ correction) → train → save             │  trainer: step n
//!  join it ◀────────────────────────────────────────┘
//!  pause + flush the engines → sync (only when due) → continue → eval → record
//! ```
//!
//! Invariants:
//! - **The bound holds.** A rollout is generated whole with one weight version (no update
//!   reaches an engine mid-rollout: the sync runs only once the rollout ahead is joined). The
//!   rollout started during step n + 1 trains at step n + 2 against the trainer's weights
//!   after step n + 1, at most one version newer than after step n; so the sync at the end of
//!   step n is due exactly when the engines' version `v` and the trainer's `t` have
//!   `v + k <= t` ([`sync_due`]). Admission ([`admit`]) enforces the bound on every sample
//!   anyway and drops (and records) any sample past it.
//! - **Nothing lost, nothing twice.** The data position moves past a rollout ahead only once
//!   it is joined whole; a checkpoint saves the first problem of the rollout ahead as its data
//!   position, so `--resume` generates that rollout again from the same problem ids and seed.
//!   A rollout ahead that fails is dropped and its step generates it again.
//! - **One caller per engine.** While the rollout ahead runs, the loop's own thread calls
//!   only the trainer; anything that needs the engines (the offload, the sync, the eval, a
//!   recovery) joins it first.

use super::Loop;
use super::record::StepLog;
use super::step::StepState;
use crate::algorithm::grpo::Sample;
use crate::env::Env;
use crate::error::RlError;
use crate::prompt::PromptCodec;
use crate::rollout::{Pending, Rollout, RolloutSpec};
use std::borrow::Cow;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tandem_runtime::launch::RemoteEngine;

/// A rollout generated ahead, once it is in.
pub(super) struct Ready {
    /// The step it is for.
    step: u32,
    spec: RolloutSpec,
    rollout: Rollout,
    /// Its generation and scoring time (s), spent beside the previous step's training.
    took_s: f64,
}

/// The thread generating a rollout ahead: the rollout and its time (s).
type Generating = JoinHandle<Result<(Rollout, f64), RlError>>;

/// The rollout ahead: running on its thread, or in and waiting for its step.
#[derive(Default)]
pub(super) struct Ahead {
    running: Option<(u32, RolloutSpec, Generating)>,
    ready: Option<Ready>,
}

impl Ahead {
    /// The spec of the rollout ahead for `step`, when one is in.
    pub(super) fn spec_for(&self, step: u32) -> Option<&RolloutSpec> {
        self.ready
            .as_ref()
            .filter(|r| r.step == step)
            .map(|r| &r.spec)
    }

    /// The first problem of the rollout ahead (running or in): the first one not trained.
    pub(super) fn first_problem(&self) -> Option<u64> {
        match (&self.running, &self.ready) {
            (Some((_, spec, _)), _) => Some(spec.first_problem),
            (None, Some(r)) => Some(r.spec.first_problem),
            (None, None) => None,
        }
    }

    fn busy(&self) -> bool {
        self.running.is_some() || self.ready.is_some()
    }
}

/// Generates and scores `spec`'s rollout on `engines` (the thread of the rollout ahead).
fn generate(
    spec: &RolloutSpec,
    engines: &[RemoteEngine],
    env: &Env,
    codec: &PromptCodec,
) -> Result<(Rollout, f64), RlError> {
    let t = Instant::now();
    let mut pending = Pending::new(spec, engines.len(), env, codec)?;
    pending
        .generate(spec, engines, codec, &|_, _, _| {})
        .map_err(|(_, e)| e)?;
    let rollout = pending.finish(spec, env, codec)?;
    Ok((rollout, t.elapsed().as_secs_f64()))
}

/// Whether the end of a step must sync: with the engines on version `served` and the
/// trainer on `trained`, the rollout generated next trains against at most `trained + 1`,
/// which must be within `k` of `served` (k = 0: whenever the trainer is ahead).
pub(super) fn sync_due(served: u64, trained: u64, k: u32) -> bool {
    served < trained && (k == 0 || served + u64::from(k) <= trained)
}

/// The samples within `k` versions of `trained` (the trainer's version before the step),
/// and how many samples were past it. `k` = 0 admits everything: the synchronous loop's
/// samples come from the weights it trains.
pub(super) fn admit(samples: Vec<Sample>, trained: u64, k: u32) -> (Vec<Sample>, usize) {
    if k == 0 {
        return (samples, 0);
    }
    let before = samples.len();
    let kept: Vec<Sample> = samples
        .into_iter()
        .filter(|s| trained.saturating_sub(s.version) <= u64::from(k))
        .collect();
    let dropped = before - kept.len();
    (kept, dropped)
}

impl Loop<'_> {
    /// The samples a step trains: with k ≥ 1, those within k versions of the trainer's
    /// weights ([`admit`]); how stale they were goes into the step's metrics, and a sample
    /// past the bound into a `stale_dropped` event.
    pub(super) fn admitted<'s>(&self, train: &'s [Sample], log: &mut StepLog) -> Cow<'s, [Sample]> {
        let k = self.max_staleness();
        if k == 0 {
            return Cow::Borrowed(train);
        }
        let trained = self.cursor.weight_version;
        let (kept, dropped) = admit(train.to_vec(), trained, k);
        let m = &mut log.metrics;
        for s in &kept {
            let behind = trained.saturating_sub(s.version);
            *m.staleness.entry(behind.to_string()).or_default() += 1;
        }
        m.staleness_max = kept.iter().map(|s| trained.saturating_sub(s.version)).max();
        m.stale_dropped = Some(dropped as u64);
        if dropped > 0 {
            self.events.record(
                log.step,
                "loop",
                "stale_dropped",
                &format!("{dropped} samples more than {k} versions behind version {trained}"),
            );
        }
        Cow::Owned(kept)
    }

    /// The staleness bound `[algorithm] max_staleness`.
    pub(super) fn max_staleness(&self) -> u32 {
        self.plan.algorithm.max_staleness
    }

    /// The weight version the engines serve (before the first sync: what they started with).
    pub(super) fn served(&self) -> u64 {
        self.bridge
            .version()
            .unwrap_or_else(|| self.engines.min_version())
    }

    /// Takes the rollout generated ahead for this step, if one is in: the step's first round.
    pub(super) fn take_ahead(&mut self, s: &mut StepState) -> bool {
        let step = s.log.step;
        let Some(ready) = self.ahead.ready.take_if(|r| r.step == step) else {
            return false;
        };
        s.adopt(ready.spec, ready.rollout);
        s.log.metrics.ahead_s = Some(ready.took_s);
        true
    }

    /// Starts the rollout of the step after `step` on its own thread (k ≥ 1, not the last
    /// step, none already ahead).
    pub(super) fn start_ahead(&mut self, step: u32) -> Result<(), RlError> {
        if self.max_staleness() == 0 || step >= self.cursor.total_steps || self.ahead.busy() {
            return Ok(());
        }
        let next = step + 1;
        let spec = self.spec_for(next);
        let (engines, env, codec) = (
            self.engines.remotes.clone(),
            Arc::clone(&self.env),
            Arc::clone(&self.codec),
        );
        let thread_spec = spec.clone();
        let handle = std::thread::Builder::new()
            .name(format!("rollout-ahead-{next}"))
            .spawn(move || generate(&thread_spec, &engines, &env, &codec))
            .map_err(|e| RlError::failed(format!("cannot start the rollout ahead: {e}")))?;
        self.events.record(
            step,
            "loop",
            "ahead",
            &format!("step {next} version {}", spec.version),
        );
        self.ahead.running = Some((next, spec, handle));
        Ok(())
    }

    /// Waits for the rollout ahead: once it is in, the data position moves past it; one
    /// that failed is dropped (its step generates it again), said in an `ahead_failed`
    /// event.
    pub(super) fn join_ahead(&mut self, log: &mut StepLog) {
        let Some((next, spec, handle)) = self.ahead.running.take() else {
            return;
        };
        let t = Instant::now();
        let joined = handle
            .join()
            .unwrap_or_else(|_| Err(RlError::failed("the rollout-ahead thread panicked")));
        super::add_time(&mut log.phases, "wait_ahead", t.elapsed());
        match joined {
            Ok((rollout, took_s)) => {
                self.cursor.data_position += u64::from(spec.prompts);
                self.ahead.ready = Some(Ready {
                    step: next,
                    spec,
                    rollout,
                    took_s,
                });
            }
            Err(e) => {
                // Its trajectories are lost whole; its step starts them again, new ids.
                let n = u64::from(spec.prompts) * u64::from(spec.group_size);
                log.metrics.count_trajectories(&crate::rollout::Ledger {
                    started: n,
                    dropped: n,
                    ..Default::default()
                });
                tracing::warn!("the rollout ahead for step {next} failed: {e}");
                self.events
                    .record(log.step, "loop", "ahead_failed", &e.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(version: u64) -> Sample {
        Sample {
            group: 0,
            prompt: vec![1],
            completion: vec![2],
            logprobs: vec![-0.1],
            reward: 1.0,
            version,
            turn: None,
        }
    }

    /// Every sample `admit` lets through is within k versions; the rest are counted.
    #[test]
    fn admission_keeps_exactly_the_samples_within_the_bound() {
        let samples: Vec<Sample> = (0..6).map(sample).collect();
        let (kept, dropped) = admit(samples.clone(), 5, 2);
        assert_eq!(
            kept.iter().map(|s| s.version).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert_eq!(dropped, 3);
        let (kept, dropped) = admit(samples, 5, 0);
        assert_eq!((kept.len(), dropped), (6, 0));
    }

    /// Simulates the schedule: the rollout for step n + 1 starts during step n with the
    /// engines' version, each step trains one version on, and the end of each step syncs
    /// when `sync_due` says. Every rollout trains within k versions, and k ≥ 2 syncs less
    /// often than k = 1.
    #[test]
    fn the_sync_schedule_keeps_every_rollout_within_the_bound() {
        let mut syncs_by_k = Vec::new();
        for k in 1..=4u32 {
            let (mut served, mut trained, mut syncs) = (0u64, 0u64, 0);
            // Step 1's rollout is generated at step 1 itself.
            let mut next_rollout_version = served;
            for _step in 1..=40 {
                let this = next_rollout_version;
                // Started during this step, before its sync.
                next_rollout_version = served;
                assert!(trained - this <= u64::from(k), "k {k}: {trained} vs {this}");
                trained += 1;
                if sync_due(served, trained, k) {
                    served = trained;
                    syncs += 1;
                }
            }
            syncs_by_k.push(syncs);
        }
        assert_eq!(syncs_by_k[0], 40, "k = 1 syncs every step");
        assert!(syncs_by_k.windows(2).all(|w| w[1] < w[0]), "{syncs_by_k:?}");
    }

    /// One step of a random run: whether it trains (a batch without signal does not),
    /// whether its rollout ahead failed (the next step generates its own), whether an eval
    /// is due after it (the sync cannot wait).
    #[derive(Debug, Clone, Copy)]
    struct StepDraw {
        trains: bool,
        ahead_fails: bool,
        eval: bool,
    }

    proptest! {
        /// The loop's order over random runs: take the rollout ahead (or generate one now),
        /// start the next one, admit, train, join, sync when `sync_due` says (k = 0 at an eval
        /// or the last step). Every rollout is within k versions of the weights it trains,
        /// so admission never has to drop one.
        #[test]
        fn random_runs_never_need_admission_to_drop(
            k in 1u32..5,
            draws in proptest::collection::vec(
                (proptest::bool::weighted(0.8), proptest::bool::weighted(0.1),
                 proptest::bool::weighted(0.1))
                    .prop_map(|(trains, ahead_fails, eval)| StepDraw { trains, ahead_fails, eval }),
                1..40,
            ),
        ) {
            let (mut served, mut trained) = (7u64, 7u64);
            let mut ahead: Option<u64> = None;
            let last = draws.len() - 1;
            for (i, d) in draws.iter().enumerate() {
                let version = ahead.take().unwrap_or(served);
                if i < last && !d.ahead_fails {
                    ahead = Some(served);
                }
                let samples = vec![sample(version)];
                let (kept, dropped) = admit(samples, trained, k);
                prop_assert_eq!(dropped, 0, "step {}: version {} trained {}", i, version, trained);
                prop_assert_eq!(kept.len(), 1);
                if d.trains {
                    trained += 1;
                }
                let k_eff = if i == last || d.eval { 0 } else { k };
                if sync_due(served, trained, k_eff) {
                    served = trained;
                }
                if i == last || d.eval {
                    prop_assert_eq!(served, trained, "the engines serve the newest weights");
                }
            }
        }
    }
}
