//! Drafter training in a step's bubbles. The loop sends each engine rank's finished share
//! (its sequences) the moment its engine returns it; this runs beside the rollout:
//!
//! 1. a finished rank's engine computes its sequences' hidden states (it is idle now); a rank
//!    that finished while others still generate is then drained on its own (pause → flush →
//!    release of its KV cache, when the run releases memory), so the drafter trains in memory
//!    the engine gave back;
//! 2. once `min_ranks_for_training` ranks are done, the drafter trainer onloads its regions
//!    and those ranks go `released → training`; ranks done later join as they finish;
//! 3. drafter steps on everything gathered so far, until the last engine finishes (the
//!    share channel closes) or `max_steps_per_bubble` steps are taken; a bubble that had a
//!    rank finish while others still generated takes at least `min_steps_per_bubble` steps
//!    (0 by default: a tail shorter than a drafter step trains nothing, and the share that
//!    ends the rollout is not even turned into hidden states);
//! 4. the trained drafter is exported for the sync, the regions are offloaded again and the
//!    ranks go back to `released`.
//!
//! `train_in = "after_rollout"` runs the same after the rollout (the channel already closed):
//! all shares at once, `max_steps_per_bubble` steps.

use super::{Draft, NAME};
use crate::bubble::BubbleOp;
use crate::events::EventLog;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};
use tandem_plugin_api::{
    FeatureBatch, FeatureRoute, FeatureSource, HiddenStatesRequest, LossConfig, LossKind, Metric,
    ROption, RVec, TrainBatch, TrainSequence, UpdateKind, UpdatePayload,
};
use tandem_runtime::launch::RemoteEngine;
use tandem_runtime::orchestrator::EngineOp;

/// An engine rank's finished share of the rollout: its sequences (prompt + completion) and
/// their prompt lengths.
pub(in crate::driver) struct Finished {
    /// The engine rank.
    pub rank: usize,
    /// Prompt + completion tokens of every sequence.
    pub tokens: Vec<Vec<u32>>,
    /// Each sequence's prompt length.
    pub prompt_lens: Vec<u32>,
    /// Other ranks still generated when this one finished.
    pub early: bool,
}

/// What a bubble did.
#[derive(Debug, Default, Clone)]
pub(in crate::driver) struct BubbleReport {
    /// Drafter optimiser steps taken.
    pub steps: u32,
    /// Mean drafter loss over them.
    pub loss: Option<f64>,
    /// Seconds the drafter trainer held its regions (onload to offload).
    pub train_s: f64,
    /// Seconds of those while some engine still generated.
    pub overlap_s: f64,
    /// Why the drafter trainer failed, if it did (the drafter goes off for good).
    pub failure: Option<String>,
    /// Ranks drained in the bubble and the lifecycle operations their engines took.
    pub drained: Vec<(usize, Vec<EngineOp>)>,
}

/// What a bubble works with.
pub(in crate::driver) struct BubbleCtx<'a> {
    pub step: u32,
    pub engines: &'a [RemoteEngine],
    pub events: &'a EventLog,
    /// Applies a coordinator operation to a rank and logs it; `false` when refused.
    pub transition: &'a (dyn Fn(usize, BubbleOp) -> bool + Sync),
    /// Kill the drafter trainer after the first drafter step (`TANDEM_CHAOS` `drafter=N`).
    pub kill_after_first: bool,
    /// What an early rank's drain releases (empty: no drain).
    pub drain: &'a [String],
}

/// One rank's sequences and their hidden states.
struct Shard {
    rank: usize,
    early: bool,
    tokens: Vec<Vec<u32>>,
    prompt_lens: Vec<u32>,
    features: Vec<f32>,
}

impl Draft {
    /// Runs one bubble (see the module doc) on the shares `rx` delivers.
    pub(in crate::driver) fn bubble(
        &mut self,
        cx: &BubbleCtx<'_>,
        rx: &Receiver<Finished>,
    ) -> BubbleReport {
        let mut report = BubbleReport::default();
        let mut shards: Vec<Shard> = Vec::new();
        let mut training: Vec<usize> = Vec::new();
        let mut losses = Vec::new();
        let mut open = true;
        let mut started: Option<Instant> = None;
        let budget = self.settings.max_steps_per_bubble;
        let min_ranks = self.settings.min_ranks_for_training.max(1) as usize;
        // A bubble overlaps the rollout: once every engine is done, it ends.
        let overlapping = self.settings.train_in == crate::config::TrainIn::Bubbles;
        loop {
            let can_train = shards.len() >= min_ranks && report.steps < budget;
            let next = if !open {
                None
            } else if can_train {
                match rx.try_recv() {
                    Ok(f) => Some(f),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            } else {
                match rx.recv() {
                    Ok(f) => Some(f),
                    Err(_) => {
                        open = false;
                        None
                    }
                }
            };
            if let Some(f) = next {
                // In a bubble, the share that ended the rollout would only delay the step:
                // its hidden states are not computed unless steps are still owed.
                let owed_any = report.steps < self.settings.min_steps_per_bubble
                    && (f.early || shards.iter().any(|s| s.early));
                if overlapping && !f.early && !owed_any {
                    continue;
                }
                match self.features(cx, f) {
                    Ok(s) => {
                        if s.early && !cx.drain.is_empty() {
                            let engine = &cx.engines[s.rank];
                            let ops = crate::phases::drain_one(
                                engine, s.rank, cx.drain, cx.events, cx.step,
                            );
                            report.drained.push((s.rank, ops));
                        }
                        if started.is_some() && (cx.transition)(s.rank, BubbleOp::Train) {
                            training.push(s.rank);
                        }
                        shards.push(s);
                    }
                    // The engine's own failure is the rollout's to report (and recover).
                    Err(e) => tracing::warn!("bubble: no hidden states for the drafter: {e}"),
                }
                continue;
            }
            // Once every engine is done the bubble ends, after the steps an early finish is owed.
            let owed =
                report.steps < self.settings.min_steps_per_bubble && shards.iter().any(|s| s.early);
            if (overlapping && !open && !owed) || !can_train {
                if open {
                    continue;
                }
                break;
            }
            if started.is_none() {
                let t = Instant::now();
                if let Err(e) = self.activate(cx) {
                    report.failure = Some(e);
                    break;
                }
                started = Some(t);
                for s in &shards {
                    if (cx.transition)(s.rank, BubbleOp::Train) {
                        training.push(s.rank);
                    }
                }
            }
            let t = Instant::now();
            match self.train_once(&shards) {
                Ok(m) => {
                    report.steps += 1;
                    if let Some(l) = metric(&m, "loss") {
                        losses.push(l);
                    }
                    if report.steps == 1 {
                        self.predicted = Some(self.predict(&m));
                    }
                    if open {
                        report.overlap_s += t.elapsed().as_secs_f64();
                    }
                }
                Err(e) => {
                    report.failure = Some(e);
                    break;
                }
            }
            if cx.kill_after_first && report.steps == 1 {
                tracing::warn!(
                    "chaos: killing the drafter trainer (pid {}) in step {}'s bubble",
                    self.pid(),
                    cx.step
                );
                crate::driver::chaos::sigkill(self.pid());
            }
        }
        // What is still to come is drained, so the rollout never waits on this side.
        while open && rx.recv().is_ok() {}
        if let Some(t) = started {
            if report.failure.is_none()
                && let Err(e) = self.finish_bubble(cx, report.steps)
            {
                report.failure = Some(e);
            }
            report.train_s = t.elapsed().as_secs_f64();
        }
        for rank in training {
            (cx.transition)(rank, BubbleOp::StopTraining);
        }
        if !losses.is_empty() {
            report.loss = Some(losses.iter().sum::<f64>() / losses.len() as f64);
        }
        report
    }

    /// The hidden states of a finished share, from its (now idle) engine.
    fn features(&self, cx: &BubbleCtx<'_>, f: Finished) -> Result<Shard, String> {
        let engine = cx
            .engines
            .get(f.rank)
            .ok_or_else(|| format!("no engine rank {}", f.rank))?;
        let report = engine
            .hidden_states(HiddenStatesRequest {
                sequences: f.tokens.iter().map(|t| RVec::from(t.clone())).collect(),
                layers: RVec::from(self.layers.clone()),
                adapter: ROption::RNone,
                route: FeatureRoute::Inline,
            })
            .map_err(|e| e.to_string())?;
        let rows: usize = f.tokens.iter().map(Vec::len).sum();
        if report.features.len() != rows * self.width as usize {
            return Err(format!(
                "engine rank {} sent {} feature values for {rows} rows of {}",
                f.rank,
                report.features.len(),
                self.width
            ));
        }
        Ok(Shard {
            rank: f.rank,
            early: f.early,
            tokens: f.tokens,
            prompt_lens: f.prompt_lens,
            features: report.features.to_vec(),
        })
    }

    /// Onloads the drafter trainer's regions within the activation timeout.
    fn activate(&self, cx: &BubbleCtx<'_>) -> Result<(), String> {
        let t = Instant::now();
        if !self.tags.is_empty() {
            self.remote.onload(&self.tags).map_err(|e| e.to_string())?;
        }
        let took = t.elapsed();
        cx.events
            .record(cx.step, NAME, "onload", &self.tags.join(","));
        let limit = Duration::from_secs_f64(self.settings.activation_timeout_secs);
        if took > limit {
            return Err(format!(
                "the drafter trainer took {:.1} s to onload its regions (activation_timeout_secs \
                 = {})",
                took.as_secs_f64(),
                self.settings.activation_timeout_secs
            ));
        }
        Ok(())
    }

    /// One drafter step on the gathered shards (as many whole sequences as fit in
    /// `max_rows`, newest shards first).
    fn train_once(&self, shards: &[Shard]) -> Result<Vec<Metric>, String> {
        let width = self.width as usize;
        let mut sequences = Vec::new();
        let mut features: Vec<f32> = Vec::new();
        let mut rows = 0u64;
        'fill: for s in shards.iter().rev() {
            let mut at = 0usize;
            for (t, &p) in s.tokens.iter().zip(&s.prompt_lens) {
                let n = t.len();
                if rows + n as u64 > self.max_rows {
                    break 'fill;
                }
                sequences.push(TrainSequence {
                    tokens: RVec::from(t.clone()),
                    prompt_len: p,
                    advantage: 0.0,
                    old_logprobs: RVec::new(),
                    ref_logprobs: RVec::new(),
                });
                features.extend_from_slice(&s.features[at * width..(at + n) * width]);
                at += n;
                rows += n as u64;
            }
        }
        let batch = TrainBatch {
            sequences: RVec::from(sequences),
            loss: LossConfig {
                kind: LossKind::Sft,
                clip_eps_low: 0.0,
                clip_eps_high: 0.0,
                kl_coef: 0.0,
                learning_rate: self.settings.learning_rate as f32,
                grad_clip: 1.0,
            },
        };
        let features = FeatureBatch {
            width: self.width,
            layers: RVec::from(self.layers.clone()),
            sources: RVec::from(vec![FeatureSource {
                route: FeatureRoute::Inline,
                rows,
                features: RVec::from(features),
            }]),
        };
        self.remote
            .train_step_features(batch, features)
            .map_err(|e| e.to_string())
    }

    /// After a bubble's steps: the drafter exported for the sync (when it trained), the
    /// regions offloaded.
    fn finish_bubble(&mut self, cx: &BubbleCtx<'_>, steps: u32) -> Result<(), String> {
        if steps > 0 {
            let update = self
                .remote
                .export_weight_update(UpdateKind::CheckpointDir)
                .map_err(|e| e.to_string())?;
            let UpdatePayload::CheckpointDir { dir } = &update.payload else {
                return Err(format!(
                    "the drafter trainer exported a {} update, not a checkpoint_dir",
                    update.payload.kind().as_str()
                ));
            };
            cx.events.record(
                cx.step,
                NAME,
                "train",
                &format!("{steps} steps, version {}", update.version),
            );
            self.exported = Some((dir.to_string(), update.version));
        }
        self.release(cx.step, cx.events).map_err(|e| e.to_string())
    }

    /// The acceptance length the drafter's accuracies per draft position predict (tokens per
    /// round: 1 + the expected run of accepted drafts), capped at `draft_tokens + 1`.
    fn predict(&self, m: &[Metric]) -> f64 {
        let mut expected = 1.0;
        let mut run = 1.0;
        for k in 0..(self.draft_tokens as usize) {
            let Some(acc) = metric(m, &format!("acc_{k}")) else {
                break;
            };
            run *= acc.clamp(0.0, 1.0);
            expected += run;
        }
        expected
    }
}

fn metric(m: &[Metric], name: &str) -> Option<f64> {
    m.iter().find(|x| x.name.as_str() == name).map(|x| x.value)
}
