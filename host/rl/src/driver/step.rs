//! One RL step as a sequence of phases: rollout (with `[algorithm] dynamic_sampling`, more
//! rounds after the first until enough groups carry signal) → drained offload → batch (with
//! `kl_in = "reward"`, the `ref` logprobs first: the KL goes into the rewards before the
//! advantages) → train → save → staged onload with the sync (`onload.rs`) → eval on the
//! steps `[eval]` names (`eval.rs`) → record (`record.rs`). Each phase is a method of [`Loop`]; what a step measures on the way
//! travels in a [`StepLog`], how far it got in a [`StepState`]: after a worker's death and
//! its recovery (`recover/`) the step runs again from there.

mod correct;
mod samples;
mod save;

use super::chaos::Point;
use super::draft::{BubbleCtx, BubbleReport, Finished};
use super::record::StepLog;
use super::spec::SpecFigures;
use super::{Loop, timed};
use crate::algorithm::grpo::{Sample, Sampling};
use crate::algorithm::{StepCx, Trained};
use crate::bridge::SyncRecord;
use crate::bubble::{BubbleOp, BubbleTimes, Coordinator, RankState};
use crate::config::TrainIn;
use crate::error::RlError;
use crate::metrics::resident;
use crate::phases::name as engine_name;
use crate::rollout::{self, Rollout, RolloutSpec};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};
use tandem_plugin_api::{Completion, RVec};

/// A step under way: what it measured and how far it got. A worker's death sends the step
/// back through [`Loop::attempt`] after the recovery; what is done stays done (each engine's
/// rollout share, the training, the checkpoint), so a step trains once and records once.
pub(super) struct StepState {
    pub(super) log: StepLog,
    spec: RolloutSpec,
    /// The rollout while engines still owe their shares.
    pending: Option<rollout::Pending>,
    /// Where each engine rank is in the rollout, and when each finished its share.
    bubble: Coordinator,
    times: BubbleTimes,
    /// What speculative decoding did in the rollout so far.
    speculated: SpecFigures,
    /// The rollout's rounds so far (one without dynamic sampling).
    sampling: Sampling,
    /// The step's seed (the first round's; later rounds derive theirs from it).
    seed: u64,
    /// The rollout once every round is in: every sample, and the samples trained on.
    rollout: Option<(Rollout, Vec<Sample>)>,
    /// What the actor trains on, made of it once (`rollouts.jsonl` gets it once).
    batch: Option<Trained>,
    /// The training of this step is done (or had nothing to train on).
    trained: bool,
    /// The checkpoint of this step is written (or none is due).
    saved: bool,
    /// Attempts so far.
    attempts: u32,
}

impl StepState {
    /// Takes a rollout generated ahead of the step as its first round.
    pub(super) fn adopt(&mut self, spec: RolloutSpec, rollout: Rollout) {
        self.spec = spec;
        self.pending = None;
        self.sampling.add(rollout);
    }
}

impl Loop<'_> {
    /// Runs step `step`; a worker that dies on the way is restarted ([`super::recover`])
    /// and the step goes on from where it was.
    pub(super) fn step(&mut self, step: u32) -> Result<(), RlError> {
        let mut s = self.begin(step)?;
        loop {
            let attempt = self.attempt(&mut s);
            self.chaos.settle();
            match attempt {
                Ok(record) => {
                    s.log.metrics.restarts = self.restarts.total();
                    return self.record(s.log, record.as_ref());
                }
                Err(e) => {
                    let t = std::time::Instant::now();
                    // The recovery needs the engines: the rollout ahead ends first.
                    self.join_ahead(&mut s.log);
                    self.recover(step, e)?;
                    super::add_time(&mut s.log.phases, "recover", t.elapsed());
                }
            }
        }
    }

    /// The rollout settings of `step`'s first round, from the current data position on,
    /// with the version the engines serve now.
    pub(super) fn spec_for(&self, step: u32) -> RolloutSpec {
        let (a, seed) = (&self.plan.algorithm, self.plan.run.seed);
        RolloutSpec {
            first_problem: self.cursor.data_position,
            prompts: a.prompts_per_step,
            group_size: a.group_size,
            max_tokens: a.max_tokens,
            temperature: a.temperature,
            seed: seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ u64::from(step),
            adapter: self.bridge.request_adapter(),
            version: self.served(),
        }
    }

    /// The step's rollout settings (those of the rollout generated ahead for it, if one is
    /// in).
    fn begin(&self, step: u32) -> Result<StepState, RlError> {
        let a = &self.plan.algorithm;
        let ahead = self.ahead.spec_for(step).cloned();
        let spec = ahead.clone().unwrap_or_else(|| self.spec_for(step));
        let seed = spec.seed;
        let rounds = if a.dynamic_sampling {
            a.max_sampling_rounds
        } else {
            0
        };
        let pending = match ahead {
            Some(_) => None,
            None => Some(rollout::Pending::new(
                &spec,
                self.engines.remotes.len(),
                &self.env,
                &self.codec,
            )?),
        };
        let ranks = self.engines.remotes.len();
        let min_ranks = match (&self.draft, &self.plan.drafter.rl) {
            (Some(_), Some(d)) => d.min_ranks_for_training as usize,
            _ => 1,
        };
        Ok(StepState {
            log: StepLog::new(step),
            spec,
            pending,
            bubble: Coordinator::new(ranks, min_ranks),
            times: BubbleTimes::new(ranks),
            speculated: SpecFigures::default(),
            sampling: Sampling::new(a.prompts_per_step, rounds),
            seed,
            rollout: None,
            batch: None,
            trained: false,
            saved: false,
            attempts: 0,
        })
    }

    /// One pass through the step's phases, skipping what an earlier attempt finished.
    fn attempt(&mut self, s: &mut StepState) -> Result<Option<SyncRecord>, RlError> {
        let step = s.log.step;
        if s.attempts > 0 {
            // After a recovery every engine generates again (survivors may have been paused
            // or released mid-step) and the trainer holds all of its memory, as at the start
            // of a step.
            self.engines.bring_back(&self.events, step)?;
            self.trainer.onload(step, &self.events)?;
        }
        s.attempts += 1;
        if s.rollout.is_none() {
            if self.force_sync {
                // Engines to follow a restarted trainer (or a replaced engine behind the
                // others) get the trainer's weights before they generate.
                self.drained_offload(&mut s.log)?;
                self.staged_onload(step, true, &mut s.log.phases)?;
                self.force_sync = false;
                s.spec.version = self.served();
            }
            self.chaos.at(step, Point::Rollout, &self.workers());
            if self.take_ahead(s) {
                // Generated ahead: every rank's share is in.
                for rank in 0..s.bubble.states().len() {
                    for op in [BubbleOp::Start, BubbleOp::Finish, BubbleOp::Complete] {
                        self.bubble(step, &mut s.bubble, rank, op)?;
                    }
                }
            } else if s.sampling.rounds == 0 {
                self.rollout(s)?;
            }
            self.more_rounds(s)?;
        }
        // k >= 1: the engines generate the next step's rollout while this one trains.
        let overlap = self.max_staleness() > 0;
        self.start_ahead(step)?;
        self.chaos.at(step, Point::Offload, &self.workers());
        if !overlap {
            self.drained_offload(&mut s.log)?;
        }
        if !s.trained {
            if s.batch.is_none() {
                let (rollout, train) = s
                    .rollout
                    .as_ref()
                    .ok_or_else(|| RlError::failed("no rollout"))?;
                let train = self.admitted(train, &mut s.log);
                s.batch = Some(self.batch(rollout, &train, &mut s.log)?);
            }
            if !s.bubble.policy_may_train() {
                return Err(RlError::failed(format!(
                    "the policy trains only once every engine rank's rollout is over; ranks: {:?}",
                    s.bubble.states()
                )));
            }
            let trained = s.batch.clone().ok_or_else(|| RlError::failed("no batch"))?;
            self.chaos.at(step, Point::Train, &self.workers());
            self.train(trained, &mut s.log)?;
            s.trained = true;
        }
        if !s.saved {
            self.chaos.at(step, Point::Save, &self.workers());
            self.save(&mut s.log)?;
            s.saved = true;
        }
        if overlap {
            // The engines are the loop's again: the rollout ahead is in (or failed).
            self.join_ahead(&mut s.log);
            self.drained_offload(&mut s.log)?;
        }
        // The version every engine serves, as the bridge shipped it (before the first sync:
        // what the engines started with); with k >= 1 the sync waits while the bound allows
        // (not past the last step, nor before an eval).
        let (served, trained) = (self.served(), self.cursor.weight_version);
        let k = match step == self.cursor.total_steps || self.eval_due(step) {
            true => 0,
            false => self.max_staleness(),
        };
        let sync = self.force_sync || super::ahead::sync_due(served, trained, k);
        self.chaos.at(step, Point::Sync, &self.workers());
        let record = self.staged_onload(step, sync, &mut s.log.phases)?;
        if record.is_some() {
            self.force_sync = false;
        }
        if let Some(d) = self.draft.as_mut() {
            let t = Instant::now();
            let measured = s.log.metrics.acceptance_length;
            s.bubble
                .begin_sync()
                .map_err(|e| RlError::failed(e.to_string()))?;
            d.sync(step, measured, &self.engines.remotes, &self.events);
            s.bubble
                .end_sync()
                .map_err(|e| RlError::failed(e.to_string()))?;
            super::add_time(&mut s.log.phases, "drafter_sync", t.elapsed());
        }
        if self.eval_due(step) {
            let result = timed(&mut s.log.phases, "eval", || self.evaluate(step))?;
            s.log.metrics.set_eval(&result);
        }
        Ok(record)
    }

    /// Generates whole GRPO groups on every engine that still owes its share, each rank's
    /// bubble state following it (generating → released the moment its share is in →
    /// completed when the last is in, each logged); with a drafter, each finished share goes
    /// to the bubble's drafter training beside the rollout (`draft/bubble.rs`). Once all are
    /// in, the rollout is decoded and rewarded and the data position moves on.
    fn rollout(&mut self, s: &mut StepState) -> Result<(), RlError> {
        let step = s.log.step;
        s.spec.adapter = self.bridge.request_adapter();
        let pending = s
            .pending
            .as_mut()
            .ok_or_else(|| RlError::failed("no pending rollout"))?;
        for rank in pending.missing() {
            // A rank whose engine died mid-share is still generating (its replacement's).
            if s.bubble.states()[rank] == RankState::Idle {
                self.bubble(step, &mut s.bubble, rank, BubbleOp::Start)?;
            }
        }
        let train_in = self.draft.as_ref().and_then(|d| d.trains_at(step));
        let kill_drafter = self.chaos.kills_drafter_at(step);
        let (spec, engines, codec, events) =
            (&s.spec, &self.engines.remotes, &self.codec, &self.events);
        let shared = Mutex::new((&mut s.bubble, &mut s.times, None));
        let (tx, rx) = mpsc::channel::<Finished>();
        let tx = Mutex::new(train_in.is_some().then_some(tx));
        let done = |rank: usize, prompts: &[RVec<u32>], completions: &[Completion]| {
            let at = Instant::now();
            let early = {
                let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
                let (bubble, times, failed) = &mut *g;
                times.finished(rank, at);
                match bubble.apply(rank, BubbleOp::Finish) {
                    Ok(state) => events.record(step, &engine_name(rank), "bubble", state.name()),
                    Err(e) => *failed = Some(e),
                }
                bubble.generating() > 0
            };
            let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(tx) = tx.as_ref() {
                let tokens: Vec<Vec<u32>> = prompts
                    .iter()
                    .zip(completions)
                    .map(|(p, c)| p.iter().chain(c.tokens.iter()).copied().collect())
                    .collect();
                let prompt_lens = prompts.iter().map(|p| p.len() as u32).collect();
                // A closed channel: the bubble gave up; the rollout goes on.
                let _ = tx.send(Finished {
                    rank,
                    tokens,
                    prompt_lens,
                    early,
                });
            }
        };
        let transition = |rank: usize, op: BubbleOp| {
            let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
            match g.0.apply(rank, op) {
                Ok(state) => {
                    events.record(step, &engine_name(rank), "bubble", state.name());
                    true
                }
                Err(e) => {
                    tracing::warn!("{e}");
                    false
                }
            }
        };
        let drain = self.engines.drain_tags();
        let cx = BubbleCtx {
            step,
            engines,
            events,
            transition: &transition,
            kill_after_first: kill_drafter,
            drain: &drain,
        };
        let before = super::spec::read(engines);
        let mut draft = self.draft.as_mut();
        let t = Instant::now();
        let mut rx = Some(rx);
        let (generated, generate_s, mut report) = std::thread::scope(|sc| {
            let overlapped = match (train_in, draft.as_deref_mut(), rx.take()) {
                (Some(TrainIn::Bubbles), Some(d), Some(rx)) => {
                    let cx = &cx;
                    Some(sc.spawn(move || d.bubble(cx, &rx)))
                }
                (_, _, back) => {
                    rx = back;
                    None
                }
            };
            let generated = pending
                .generate(spec, engines, codec, &done)
                .map_err(|(_, e)| e);
            let generate_s = t.elapsed();
            // Every share is in (or failed): the bubble ends with the channel.
            drop(tx.lock().unwrap_or_else(|p| p.into_inner()).take());
            let report = overlapped.map(|h| {
                h.join().unwrap_or_else(|_| BubbleReport {
                    failure: Some("the bubble thread panicked".into()),
                    ..BubbleReport::default()
                })
            });
            (generated, generate_s, report)
        });
        super::add_time(&mut s.log.phases, "generate", generate_s);
        if report.is_some() {
            // The bubble's last drafter step and its offload, after the rollout ended.
            super::add_time(&mut s.log.phases, "drafter", t.elapsed() - generate_s);
        }
        if let (Some(TrainIn::AfterRollout), Some(d), Some(rx)) = (train_in, draft, rx.as_ref()) {
            let t = Instant::now();
            report = Some(d.bubble(&cx, rx));
            super::add_time(&mut s.log.phases, "drafter", t.elapsed());
        }
        let after = super::spec::read(engines);
        let (_, _, failed) = shared.into_inner().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = failed {
            return Err(RlError::failed(e.to_string()));
        }
        s.speculated.add(&before, &after);
        if let Some(r) = report {
            for (rank, ops) in &r.drained {
                self.engines.commit_drain(*rank, ops)?;
            }
            self.bubble_done(step, r, &mut s.log);
        }
        generated?;
        for rank in 0..s.bubble.states().len() {
            self.bubble(step, &mut s.bubble, rank, BubbleOp::Complete)?;
        }
        s.log.metrics.tail_s = s.times.tail_s();
        s.log.metrics.bubble_s = s.times.bubble_s();
        if let Some((tokens, len)) = s.speculated.figures() {
            s.log.metrics.spec_tokens = Some(tokens);
            s.log.metrics.acceptance_length = len;
        }
        let done = s
            .pending
            .take()
            .ok_or_else(|| RlError::failed("no pending rollout"))?;
        s.sampling
            .add(done.finish(&s.spec, &self.env, &self.codec)?);
        self.cursor.data_position += u64::from(s.spec.prompts);
        Ok(())
    }

    /// A bubble's figures into the step's metrics; a drafter trainer that failed turns the
    /// drafter off for the rest of the run (said once, with whether it died).
    fn bubble_done(&mut self, step: u32, r: BubbleReport, log: &mut StepLog) {
        let m = &mut log.metrics;
        *m.drafter_steps.get_or_insert(0) += r.steps;
        if r.loss.is_some() {
            m.drafter_loss = r.loss;
        }
        *m.drafter_train_s.get_or_insert(0.0) += r.train_s;
        *m.bubble_used_s.get_or_insert(0.0) += r.overlap_s;
        let (Some(failure), Some(d)) = (r.failure, self.draft.as_mut()) else {
            return;
        };
        let why = match d.death(Duration::from_secs(3)) {
            Some(death) => format!("its trainer died: {death}"),
            None => format!("its trainer failed: {failure}"),
        };
        let progress = &self.progress;
        d.switch_off_for_good(step, why, &self.engines.remotes, &self.events, &|line| {
            progress.println(line)
        });
    }

    /// One transition of a rank's bubble state, logged.
    fn bubble(
        &self,
        step: u32,
        bubble: &mut Coordinator,
        rank: usize,
        op: BubbleOp,
    ) -> Result<(), RlError> {
        let state = bubble
            .apply(rank, op)
            .map_err(|e| RlError::failed(e.to_string()))?;
        self.events
            .record(step, &engine_name(rank), "bubble", state.name());
        Ok(())
    }

    /// Pause all → flush all → release all; then the engines' resident memory, where it is
    /// comparable step to step (what a leak would grow). What the regions hold is in the
    /// ledger figures.
    fn drained_offload(&mut self, log: &mut StepLog) -> Result<(), RlError> {
        timed(&mut log.phases, "offload", || {
            self.engines.drained_offload(&self.events, log.step)
        })?;
        for (rank, e) in self.engines.remotes.iter().enumerate() {
            if let Some(pid) = e.local_pid() {
                log.rss.insert(format!("engine-{rank}"), resident(pid));
            }
        }
        Ok(())
    }

    /// The algorithm's other models (PPO's critic) → onload the trainer → `ref` logprobs
    /// (with a KL penalty) → the actor's steps → snapshot `actor`; nothing but the onload
    /// when no sequence carries signal. A trained batch is kept until the next checkpoint: a
    /// restarted trainer replays it.
    fn train(&mut self, trained: Trained, log: &mut StepLog) -> Result<(), RlError> {
        let step = log.step;
        let m = &mut log.metrics;
        timed(&mut log.phases, "train", || {
            let mut cx = StepCx {
                step,
                events: &self.events,
                metrics: m,
            };
            self.algorithm.train_others(&mut cx)?;
            self.trainer.onload(step, &self.events)?;
            if trained.batch.sequences.is_empty() {
                return Ok(());
            }
            self.optimise(trained.clone(), step, m)?;
            self.replay.push((step, trained));
            Ok(())
        })
    }
}
