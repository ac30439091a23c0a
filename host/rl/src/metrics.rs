//! Per-step metrics: one JSON object per line in `<run_dir>/metrics.jsonl`, kept in memory
//! for the plot. On resume the lines of steps after the checkpoint are dropped (they are run
//! again), the others kept.
//!
//! With `[eval]`, the steps evaluated carry `eval_accuracy` and `eval_problems` (absent
//! otherwise), and a line for step 0 — the model before training — holds only `step`,
//! `weight_version` and those two: readers of rollout figures skip it (`step > 0`).

use crate::error::RlError;
use crate::eval::EvalResult;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What one RL step measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StepMetrics {
    /// RL step (1-based).
    pub step: u32,
    /// Unix time (s) the line was written: the trackers' timestamp of the step.
    pub time: f64,
    /// Mean reward of the rollout.
    pub reward_mean: f64,
    /// Standard deviation of the rewards.
    pub reward_std: f64,
    /// Fraction of exactly right answers.
    pub exact_frac: f64,
    /// Mean completion length in tokens.
    pub completion_tokens: f64,
    /// Samples whose reward failed (a raise, a timeout, a dead worker, a value out of
    /// range): counted here, their reasons in `events.jsonl`, none trained on.
    pub reward_failed: u64,
    /// Samples no reward applied to (not trained on either).
    pub reward_not_applicable: u64,
    /// Seconds the environment spent scoring the step's samples.
    pub reward_s: f64,
    /// Mean of each reward component over the samples scored `ok`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_components: BTreeMap<String, f64>,
    /// Mean reward of the samples of each data source.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_by_source: BTreeMap<String, f64>,
    /// Loss of the last optimiser step.
    pub loss: f64,
    /// KL to the reference (0 without a reference).
    pub kl: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Fraction of clipped tokens.
    pub clip_frac: f64,
    /// Sequences trained on.
    pub train_sequences: u64,
    /// Weight version the engines serve after the sync.
    pub weight_version: u64,
    /// Bytes the sync moved.
    pub sync_bytes: u64,
    /// Latency of the sync (s): both halves of the bridge, the trainer's export included.
    pub sync_s: f64,
    /// The bridge's own figures for the sync (its `stats()`): the trainer half's by name,
    /// the engine halves' summed as `engines.<name>` (`bridge/<key>` in trackers).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bridge: BTreeMap<String, f64>,
    /// Seconds from the first engine rank's finish of its rollout share to the last one's:
    /// the rollout's long tail (0 with one engine).
    pub tail_s: f64,
    /// Engine-seconds idle during the rollout: over ranks, the last finish less its own
    /// ([`crate::bubble::BubbleTimes::bubble_s`]), what bubble-time training can use.
    pub bubble_s: f64,
    /// Tokens the rollout decoded in speculative rounds (engines with a drafter only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_tokens: Option<u64>,
    /// Their mean per verify round: accepted drafts + 1 (engines with a drafter only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acceptance_length: Option<f64>,
    /// Drafter optimiser steps taken in this step's bubbles (`[drafter] enabled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter_steps: Option<u32>,
    /// Their mean drafter loss.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter_loss: Option<f64>,
    /// Seconds the drafter trainer held its regions to train (onload to offload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter_train_s: Option<f64>,
    /// Seconds of drafter steps taken while some engine still generated: the bubble time
    /// used (beside `bubble_s`, the bubble time available).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bubble_used_s: Option<f64>,
    /// The drafter version the engines serve after the step (0: none yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter_version: Option<u64>,
    /// Whether the engines speculate after the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculating: Option<bool>,
    /// Rollout rounds the step generated (`[algorithm] dynamic_sampling` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_rounds: Option<u32>,
    /// Groups with signal it trained on (`dynamic_sampling` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups_kept: Option<u32>,
    /// Groups it dropped: all rewards equal, or more than `prompts_per_step` with signal
    /// (`dynamic_sampling` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups_dropped: Option<u32>,
    /// PPO: the critic's mean value of the step's completion tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_mean: Option<f64>,
    /// PPO: the mean λ-return (the critic's target) of those tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_mean: Option<f64>,
    /// PPO: the critic's value loss at its last step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_loss: Option<f64>,
    /// PPO: the fraction of tokens whose value the clip held at its last step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_clip_frac: Option<f64>,
    /// `max_staleness` ≥ 1: the generation and scoring time of this step's rollout, spent
    /// beside the previous step's training (s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ahead_s: Option<f64>,
    /// `max_staleness` ≥ 1: how many versions the oldest trained sample was behind the
    /// weights it trained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness_max: Option<u64>,
    /// `max_staleness` ≥ 1: the step's samples (those of groups without signal too) by how
    /// many versions they were behind the weights they trained.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub staleness: BTreeMap<String, u64>,
    /// `max_staleness` ≥ 1: samples past the bound, not trained (none while the schedule
    /// holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_dropped: Option<u64>,
    /// With a correction: the mean importance weight `π_prox / π_behav` of the trained
    /// tokens (before any cap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_weight_mean: Option<f64>,
    /// With `correction = "tis"`: the share of trained tokens whose weight the cap held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_clipped_frac: Option<f64>,
    /// The step's trajectories by state: `started` = `completed` (scored) + `failed` (reward
    /// failed) + `dropped` (lost with an engine and generated again under new ids, a failed
    /// rollout ahead, or a reward that did not apply).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trajectories: BTreeMap<String, u64>,
    /// With tools: `turns` (assistant turns per trajectory), `calls` (attempted per
    /// trajectory), `well_formed_frac` (of the attempts), `answered`, `failed` (calls).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, f64>,
    /// Wall time of each phase (s): generate, offload, train, save, onload, sync, ...
    pub phases: BTreeMap<String, f64>,
    /// Whole step (s).
    pub step_s: f64,
    /// Time outside plugin calls (s).
    pub overhead_s: f64,
    /// Resident memory of each worker process (bytes, `VmRSS`), by worker name: workers on
    /// this machine only (not those `srun` runs).
    pub rss: BTreeMap<String, u64>,
    /// The part of it each worker allocated (bytes, [`Resident::data`]), by worker name.
    pub rss_data: BTreeMap<String, u64>,
    /// Memory-ledger bytes reported by each worker (resident region bytes), by worker name.
    pub ledger: BTreeMap<String, u64>,
    /// Where each worker runs (`host (ip)` from its hello), by worker name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hosts: BTreeMap<String, String>,
    /// Greedy accuracy on the held-out set after this step (`[eval]` steps only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// Size of the held-out set (`[eval]` steps only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_problems: Option<u32>,
    /// Held-out accuracy per data source (`[eval]` steps of environments with sources).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eval_by_source: BTreeMap<String, f64>,
    /// Worker restarts of this run so far (after deaths), this process's.
    #[serde(default)]
    pub restarts: u32,
}

impl StepMetrics {
    /// Adds `ledger`'s counts to [`StepMetrics::trajectories`].
    pub fn count_trajectories(&mut self, ledger: &crate::rollout::Ledger) {
        for (k, v) in [
            ("started", ledger.started),
            ("completed", ledger.completed),
            ("failed", ledger.failed),
            ("dropped", ledger.dropped),
        ] {
            *self.trajectories.entry(k.to_owned()).or_default() += v;
        }
    }

    /// Records an evaluation's figures.
    pub fn set_eval(&mut self, result: &EvalResult) {
        self.eval_accuracy = Some(result.accuracy());
        self.eval_problems = Some(result.problems);
        self.eval_by_source = result
            .by_source
            .iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(k, (right, n))| (k.clone(), f64::from(*right) / f64::from(*n)))
            .collect();
    }
}

/// The metrics file and the steps so far.
pub struct MetricsLog {
    path: PathBuf,
    /// Every step recorded (including those before a resume).
    pub steps: Vec<StepMetrics>,
}

impl MetricsLog {
    /// A new, empty log at `path` (an existing file is an error: runs never overwrite).
    pub fn create(path: &Path) -> Result<MetricsLog, RlError> {
        std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(path)
            .map_err(RlError::io(format!("creating {}", path.display())))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            steps: Vec::new(),
        })
    }

    /// Reopens a log for a resume after `step`: lines of later steps are dropped; the line of
    /// `step` itself comes from `saved` (the checkpoint's copy) when the run died before
    /// writing it.
    pub fn resume(
        path: &Path,
        step: u32,
        saved: Option<StepMetrics>,
    ) -> Result<MetricsLog, RlError> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut steps: Vec<StepMetrics> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<StepMetrics>(l).ok())
            .filter(|m| m.step <= step)
            .collect();
        if let Some(m) = saved
            && m.step == step
            && !steps.iter().any(|s| s.step == step)
        {
            steps.push(m);
        }
        write_lines(path, &steps)?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            steps,
        })
    }

    /// Appends one step.
    pub fn push(&mut self, m: StepMetrics) -> Result<(), RlError> {
        let line = serde_json::to_string(&m)
            .map_err(|e| RlError::failed(format!("encoding metrics: {e}")))?;
        self.append(&line)?;
        self.steps.push(m);
        Ok(())
    }

    /// Appends step 0's line: the evaluation before training.
    pub fn push_before(&mut self, weight_version: u64, result: &EvalResult) -> Result<(), RlError> {
        let mut m = StepMetrics {
            step: 0,
            time: tandem_track::tensorboard::unix_now(),
            weight_version,
            ..StepMetrics::default()
        };
        m.set_eval(result);
        self.append(&line_of(&m))?;
        self.steps.push(m);
        Ok(())
    }

    /// Adds an evaluation to the recorded line of `step` (rewriting the file).
    pub fn amend_eval(&mut self, step: u32, result: &EvalResult) -> Result<(), RlError> {
        for m in self.steps.iter_mut().filter(|m| m.step == step) {
            m.set_eval(result);
        }
        write_lines(&self.path, &self.steps)
    }

    fn append(&self, line: &str) -> Result<(), RlError> {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(RlError::io(format!("opening {}", self.path.display())))?;
        writeln!(f, "{line}").map_err(RlError::io(format!("writing {}", self.path.display())))
    }

    /// The steps that ran a rollout (all but step 0's evaluation line).
    pub fn rollout_steps(&self) -> impl Iterator<Item = &StepMetrics> {
        self.steps.iter().filter(|m| m.step > 0)
    }
}

/// The line of `m`: every figure, or for step 0 (no rollout) the evaluation's only.
fn line_of(m: &StepMetrics) -> String {
    if m.step == 0 {
        let v = serde_json::json!({
            "step": 0,
            "time": m.time,
            "weight_version": m.weight_version,
            "eval_accuracy": m.eval_accuracy,
            "eval_problems": m.eval_problems,
        });
        return v.to_string();
    }
    serde_json::to_string(m).unwrap_or_default()
}

/// Replaces `path` by `steps`, one line each (through a temporary file and a rename).
fn write_lines(path: &Path, steps: &[StepMetrics]) -> Result<(), RlError> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut body = String::new();
    for m in steps {
        body.push_str(&line_of(m));
        body.push('\n');
    }
    std::fs::write(&tmp, body).map_err(RlError::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(RlError::io(format!("replacing {}", path.display())))
}

/// The sum of a worker's figures whose name starts with `prefix` (e.g. `allocated_bytes.`:
/// its memory-ledger bytes, tag by tag), as whole bytes.
pub fn bytes_with_prefix(stats: &tandem_plugin_api::ComponentStats, prefix: &str) -> u64 {
    let sum: f64 = stats
        .metrics
        .iter()
        .filter(|m| m.name.as_str().starts_with(prefix))
        .map(|m| m.value)
        .sum();
    sum as u64
}

/// Resident memory of one process in bytes (zeros once it is gone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    /// All of it (`VmRSS`).
    pub total: u64,
    /// What the process allocated (`RssAnon` + `RssShmem`: heap, stacks, memory regions and
    /// shared segments). The rest of `VmRSS` is file-backed pages (its code, mapped files),
    /// which the kernel drops under memory pressure and faults back in as code runs, so only
    /// this part is comparable step to step when the machine is busy: where a leak shows.
    pub data: u64,
}

/// Reads [`Resident`] from `/proc/<pid>/status`.
pub fn resident(pid: u32) -> Resident {
    let s = crate::bridge::rss::status(pid).unwrap_or_default();
    Resident {
        total: s.rss,
        data: s.anon + s.shmem,
    }
}
