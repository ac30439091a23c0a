//! The trackers of a run as one set: each has a cursor (the last step it acknowledged, in the
//! tracking state), and [`Sinks::sync`] sends every tracker the lines of `metrics.jsonl` past
//! its cursor. A tracker that fails is *down*: one warning line, its lines stay its backlog,
//! and the next sync tries again from its cursor (a line "back" when it answers).
//! [`push`] is the same done once, for `tandem log push`.

use crate::error::TrackError;
use crate::flatten::{Line, read_lines};
use crate::mlflow::MlflowSink;
use crate::section::TrackPlan;
use crate::state::{SinkState, TrackState};
use crate::tensorboard::TensorboardSink;
use crate::wandb::WandbSink;
use std::path::{Path, PathBuf};

/// Lines sent per call to a tracker.
const LINES_PER_SEND: usize = 50;

/// What the trackers know of the run.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The run directory (`metrics.jsonl`, the tracking state).
    pub run_dir: PathBuf,
    /// `[run] name`.
    pub name: String,
    /// The resolved plan (W&B config, MLflow params).
    pub config: serde_json::Value,
    /// The job file's text (TensorBoard's `job` text).
    pub job_text: String,
    /// A resumed run's checkpoint step: lines from this step on are sent again (they are run
    /// again), TensorBoard's earlier ones purged.
    pub restart_at: Option<u32>,
}

/// One tracker.
pub(crate) trait Sink: Send {
    /// `tensorboard`, `wandb` or `mlflow`.
    fn name(&self) -> &'static str;
    /// The state's key: the tracker and its target.
    fn key(&self) -> String;
    /// Opens (or re-opens) the tracker's run, recording its id in `state`.
    fn open(&mut self, state: &mut SinkState, run: &RunInfo) -> Result<(), TrackError>;
    /// Sends lines, in step order; `Ok` once the tracker has them.
    fn send(&mut self, lines: &[&Line]) -> Result<(), TrackError>;
    /// Ends the tracker's run (`checkpoint`: the run's final checkpoint; `failed`: the run
    /// stopped on an error).
    fn finish(&mut self, checkpoint: Option<&Path>, failed: bool) -> Result<(), TrackError>;
}

struct Slot {
    sink: Box<dyn Sink>,
    open: bool,
    /// Why it is down (`None`: up, or not tried yet).
    down: Option<String>,
}

/// The run's trackers and their state.
pub(crate) struct Sinks {
    slots: Vec<Slot>,
    state: TrackState,
    run: RunInfo,
}

/// What [`push`] did.
#[derive(Debug, Clone, Default)]
pub struct PushReport {
    /// Lines each tracker took (`tensorboard`, `wandb`, `mlflow`).
    pub sent: Vec<(String, usize)>,
    /// Lines each tracker still lacks, where one is down.
    pub pending: Vec<(String, usize)>,
    /// Warning lines.
    pub warnings: Vec<String>,
}

impl Sinks {
    /// The trackers of `plan` with the run directory's state; a resume moves their cursors
    /// back to before `run.restart_at`.
    pub(crate) fn new(plan: &TrackPlan, run: RunInfo) -> Result<Sinks, TrackError> {
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        if let Some(dir) = &plan.tensorboard {
            // Absolute, so the state's key is the same however the run directory was named
            // (`tandem run job.toml` vs `tandem run --resume run`).
            let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
            sinks.push(Box::new(TensorboardSink::new(dir)));
        }
        if let Some(w) = &plan.wandb {
            sinks.push(Box::new(WandbSink::new(w.clone())));
        }
        if let Some(m) = &plan.mlflow {
            sinks.push(Box::new(MlflowSink::new(m.clone())));
        }
        let mut state = TrackState::load(&run.run_dir)?;
        if let Some(s) = run.restart_at {
            for st in state.targets.values_mut() {
                st.sent = st
                    .sent
                    .zip(s.checked_sub(1))
                    .map(|(sent, before)| sent.min(before));
            }
        }
        Ok(Sinks {
            slots: sinks
                .into_iter()
                .map(|sink| Slot {
                    sink,
                    open: false,
                    down: None,
                })
                .collect(),
            state,
            run,
        })
    }

    /// Sends each tracker its backlog from `metrics.jsonl`; returns the warning lines (a
    /// tracker down, a tracker back) and the lines each tracker took.
    pub(crate) fn sync(&mut self) -> (Vec<String>, Vec<(String, usize)>) {
        let mut warnings = Vec::new();
        let mut sent = Vec::new();
        let lines = match read_lines(&self.run.run_dir.join("metrics.jsonl")) {
            Ok(l) => l,
            Err(e) => return (vec![format!("warning: tracking: {e}")], sent),
        };
        for i in 0..self.slots.len() {
            let n = self.sync_one(i, &lines, &mut warnings);
            sent.push((self.slots[i].sink.name().to_string(), n));
        }
        (warnings, sent)
    }

    fn sync_one(&mut self, i: usize, lines: &[Line], warnings: &mut Vec<String>) -> usize {
        let key = self.slots[i].sink.key();
        let mut st = self.state.targets.get(&key).cloned().unwrap_or_default();
        let slot = &mut self.slots[i];
        let result = (|| {
            if !slot.open {
                slot.sink.open(&mut st, &self.run)?;
                slot.open = true;
            }
            // After the open: a tracker that no longer knows its run starts a new one, from
            // the first line.
            let backlog: Vec<&Line> = lines
                .iter()
                .filter(|l| st.sent.is_none_or(|s| l.step > s))
                .collect();
            let mut n = 0;
            for chunk in backlog.chunks(LINES_PER_SEND) {
                slot.sink.send(chunk)?;
                n += chunk.len();
                st.sent = chunk.last().map(|l| l.step);
                self.state.targets.insert(key.clone(), st.clone());
                self.state.save(&self.run.run_dir)?;
            }
            self.state.targets.insert(key.clone(), st.clone());
            Ok::<usize, TrackError>(n)
        })();
        match result {
            Ok(n) => {
                if slot.down.take().is_some() {
                    warnings.push(format!(
                        "tracking: {} answers again; its backlog of {n} steps is sent",
                        slot.sink.name()
                    ));
                }
                n
            }
            Err(e) => {
                if slot.down.is_none() {
                    warnings.push(format!(
                        "warning: tracking: {e} — the run goes on; the steps it misses are \
                         sent when it answers (or by `tandem log push {}`)",
                        self.run.run_dir.display()
                    ));
                }
                slot.down = Some(e.to_string());
                // A tracker that fails mid-send may have lost its connection or sidecar:
                // reopened at the next try.
                slot.open = false;
                0
            }
        }
    }

    /// Sends the last backlog and ends every tracker's run that is up to date.
    pub(crate) fn finish(&mut self, checkpoint: Option<&Path>, failed: bool) -> PushReport {
        let (mut warnings, sent) = self.sync();
        let lines = read_lines(&self.run.run_dir.join("metrics.jsonl")).unwrap_or_default();
        let mut pending = Vec::new();
        for slot in &mut self.slots {
            let st = self
                .state
                .targets
                .get(&slot.sink.key())
                .cloned()
                .unwrap_or_default();
            let left = lines
                .iter()
                .filter(|l| st.sent.is_none_or(|s| l.step > s))
                .count();
            if slot.down.is_some() || left > 0 {
                pending.push((slot.sink.name().to_string(), left));
                continue;
            }
            if let Err(e) = slot.sink.finish(checkpoint, failed) {
                warnings.push(format!("warning: tracking: ending the run: {e}"));
            }
        }
        PushReport {
            sent,
            pending,
            warnings,
        }
    }
}

/// Sends a run directory's `metrics.jsonl` to the trackers of `plan` (each from its cursor)
/// and ends their runs: `tandem log push`.
pub fn push(
    plan: &TrackPlan,
    run: RunInfo,
    checkpoint: Option<&Path>,
) -> Result<PushReport, TrackError> {
    Ok(Sinks::new(plan, run)?.finish(checkpoint, false))
}
