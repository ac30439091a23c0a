//! The record phase: what a step measured becomes its `metrics.jsonl` line, the progress
//! display's figures and, every 10 steps and at the end, `plot.png`; at the end of the run,
//! its summary.

use super::{Loop, Phases, RunSummary};
use crate::bridge::SyncRecord;
use crate::env::ScoreTally;
use crate::error::RlError;
use crate::metrics::{Resident, StepMetrics, resident};
use crate::plot;
use crate::rollout::Rollout;
use std::collections::BTreeMap;
use std::time::Instant;
use tandem_plugin_api::ComponentStats;

/// What a step measured so far.
pub(super) struct StepLog {
    /// The step.
    pub step: u32,
    started: Instant,
    /// Wall time of each phase.
    pub phases: Phases,
    /// The step's figures (phases, memory and step time are added by the record phase).
    pub metrics: StepMetrics,
    /// Resident memory of each worker, by name.
    pub rss: BTreeMap<String, Resident>,
}

impl StepLog {
    /// A step starting now.
    pub fn new(step: u32) -> StepLog {
        StepLog {
            step,
            started: Instant::now(),
            phases: Phases::new(),
            metrics: StepMetrics {
                step,
                ..StepMetrics::default()
            },
            rss: BTreeMap::new(),
        }
    }

    /// Reward mean and spread, exact-answer rate and completion length of the rollout.
    pub fn rollout_figures(&mut self, rollout: &Rollout) {
        let m = &mut self.metrics;
        // Per trajectory: a multi-turn one is one sample per turn, all with its reward.
        let opening = || rollout.samples.iter().filter(|s| s.opens());
        let n = opening().count().max(1) as f64;
        let rewards: Vec<f64> = opening().map(|s| f64::from(s.reward)).collect();
        m.reward_mean = rewards.iter().sum::<f64>() / n;
        let var = rewards
            .iter()
            .map(|r| (r - m.reward_mean).powi(2))
            .sum::<f64>()
            / n;
        m.reward_std = var.sqrt();
        m.exact_frac = rollout.exact as f64 / n;
        let tokens: usize = rollout.samples.iter().map(|s| s.completion.len()).sum();
        m.completion_tokens = tokens as f64 / n;
        m.count_trajectories(&rollout.ledger);
        if let Some(c) = &rollout.calls {
            let turns = rollout.samples.len() as f64;
            m.tools = BTreeMap::from([
                ("turns".to_owned(), turns / n),
                ("calls".to_owned(), c.attempted as f64 / n),
                (
                    "well_formed_frac".to_owned(),
                    c.well_formed as f64 / (c.attempted.max(1)) as f64,
                ),
                ("answered".to_owned(), c.answered as f64),
                ("failed".to_owned(), c.failed as f64),
            ]);
        }
        let t = &rollout.tally;
        m.reward_failed = t.failed;
        m.reward_not_applicable = t.not_applicable;
        m.reward_s = t.seconds;
        m.reward_components = ScoreTally::means(&t.components);
        m.reward_by_source = ScoreTally::means(&t.sources);
    }
}

impl Loop<'_> {
    /// Completes the step's figures (sync, served version, memory, times), shows them,
    /// appends them to the metrics log and redraws the plot every 10 steps.
    pub(super) fn record(
        &mut self,
        log: StepLog,
        sync: Option<&SyncRecord>,
    ) -> Result<(), RlError> {
        let StepLog {
            step,
            started,
            phases,
            mut metrics,
            mut rss,
        } = log;
        let m = &mut metrics;
        if let Some(r) = sync {
            m.sync_bytes = r.bytes_moved;
            m.sync_s = r.latency_s;
            m.bridge = r.bridge_stats.iter().cloned().collect();
        }
        m.weight_version = self.engines.min_version();
        if let Some(pid) = self.trainer.remote.local_pid() {
            rss.insert("trainer".to_string(), resident(pid));
        }
        for (rank, e) in self.engines.remotes.iter().enumerate() {
            m.hosts.insert(format!("engine-{rank}"), e.host());
        }
        m.hosts
            .insert("trainer".to_string(), self.trainer.remote.host());
        if let Some(d) = &self.draft {
            if let Some(pid) = d.local_pid() {
                rss.insert(super::draft::NAME.to_string(), resident(pid));
            }
            m.drafter_version = Some(d.served());
            m.speculating = Some(d.speculating());
        }
        for (name, r) in rss {
            m.rss.insert(name.clone(), r.total);
            m.rss_data.insert(name, r.data);
        }
        self.ledger_figures(m);
        m.step_s = started.elapsed().as_secs_f64();
        m.time = tandem_track::tensorboard::unix_now();
        m.overhead_s = (m.step_s - phases.values().sum::<f64>()).max(0.0);
        m.phases = phases;
        self.progress.step(m);
        self.metrics.push(metrics)?;
        // Every step's events reach the file with its metrics line: a killed controller
        // leaves the log of every step it recorded.
        self.events.flush();
        if (step % 10 == 0 || step == self.cursor.total_steps)
            && let Err(e) = plot::draw(&self.files.plot, &self.plan.name, &self.metrics.steps)
        {
            self.progress.println(&format!("warning: {e}"));
        }
        Ok(())
    }

    /// Memory-ledger bytes (allocated region bytes the plugins report) of every worker.
    fn ledger_figures(&self, m: &mut StepMetrics) {
        let mut add = |name: String, stats: Option<ComponentStats>| {
            if let Some(s) = stats {
                m.ledger.insert(
                    name,
                    crate::metrics::bytes_with_prefix(&s, "allocated_bytes."),
                );
            }
        };
        for (rank, e) in self.engines.remotes.iter().enumerate() {
            add(format!("engine-{rank}"), e.stats().ok());
        }
        add("trainer".into(), self.trainer.remote.stats().ok());
        if let Some(bytes) = self.draft.as_ref().and_then(|d| d.ledger()) {
            m.ledger.insert(super::draft::NAME.into(), bytes);
        }
        m.ledger.extend(self.algorithm.ledger());
    }

    /// The run's summary after its last step.
    pub(super) fn finish(&self) -> RunSummary {
        self.progress.finish();
        let steps: Vec<_> = self.metrics.rollout_steps().collect();
        let first_reward = steps.first().map(|m| m.reward_mean).unwrap_or(f64::NAN);
        let tail: Vec<f64> = steps.iter().rev().take(5).map(|m| m.reward_mean).collect();
        let final_reward = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
        let evals: Vec<(u32, f64)> = self
            .metrics
            .steps
            .iter()
            .filter_map(|m| m.eval_accuracy.map(|a| (m.step, a)))
            .collect();
        RunSummary {
            last_step: self.cursor.total_steps,
            first_reward,
            final_reward,
            first_eval: evals.first().copied(),
            last_eval: evals.last().copied(),
            run_dir: self.opts.run_dir.clone(),
            checkpoint: self.last_checkpoint.clone(),
        }
    }
}
