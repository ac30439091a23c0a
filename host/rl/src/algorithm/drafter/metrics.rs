//! A drafter job's per-step figures: one JSON object per line in `<run_dir>/metrics.jsonl`,
//! kept in memory for the plot. The line of step 0 holds the untrained drafter's acceptance
//! and memory only.

use crate::config::FeatureRouteKind;
use crate::error::RlError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use tandem_plugin_api::Metric;

/// What one step of a drafter job measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DrafterStepMetrics {
    /// Step (1-based).
    pub step: u32,
    /// How the hidden states travelled.
    pub route: FeatureRouteKind,
    /// Drafter loss (the draft positions' cross-entropies, weighted as the trainer defines).
    pub loss: f64,
    /// Top-1 accuracy of each draft position (position `k` predicts the token `k + 1` ahead
    /// of the verified one), on the step's batch before the update.
    pub acc: Vec<f64>,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens in the loss.
    pub tokens: f64,
    /// Sequences trained on.
    pub sequences: u64,
    /// Mean completion length (tokens).
    pub completion_tokens: f64,
    /// Feature rows (positions) moved from the engines to the trainer.
    pub feature_rows: u64,
    /// Feature bytes moved.
    pub transfer_bytes: u64,
    /// Time the trainer waited for and received the features (s).
    pub recv_s: f64,
    /// Mean acceptance length of greedy speculative decoding on the held-out prompts with
    /// this step's drafter (eval steps only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acceptance_length: Option<f64>,
    /// Decode tokens/s of that measurement (eval steps only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_tokens_per_s: Option<f64>,
    /// Wall time of each phase (s).
    pub phases: BTreeMap<String, f64>,
    /// Whole step (s).
    pub step_s: f64,
    /// Resident memory of each worker (bytes, `VmRSS`).
    pub rss: BTreeMap<String, u64>,
    /// The part of it each worker allocated (bytes, [`crate::metrics::Resident::data`]).
    pub rss_data: BTreeMap<String, u64>,
    /// Memory-ledger bytes each worker reports.
    pub ledger: BTreeMap<String, u64>,
}

impl DrafterStepMetrics {
    /// Takes the trainer's figures: `loss`, `grad_norm`, `tokens`, `recv_s`, `acc_<k>`.
    pub(super) fn set_trainer(&mut self, metrics: &[Metric]) {
        let mut acc = BTreeMap::new();
        for m in metrics {
            match m.name.as_str() {
                "loss" => self.loss = m.value,
                "grad_norm" => self.grad_norm = m.value,
                "tokens" => self.tokens = m.value,
                "recv_s" => self.recv_s = m.value,
                name => {
                    if let Some(k) = name
                        .strip_prefix("acc_")
                        .and_then(|k| k.parse::<u32>().ok())
                    {
                        acc.insert(k, m.value);
                    }
                }
            }
        }
        self.acc = acc.into_values().collect();
    }
}

/// The metrics file and the steps so far.
pub(super) struct DrafterMetricsLog {
    path: PathBuf,
    /// Every step recorded.
    pub steps: Vec<DrafterStepMetrics>,
}

impl DrafterMetricsLog {
    /// A new, empty log (an existing file is an error: runs never overwrite).
    pub fn create(path: &Path) -> Result<DrafterMetricsLog, RlError> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(RlError::io(format!("creating {}", path.display())))?;
        Ok(DrafterMetricsLog {
            path: path.to_path_buf(),
            steps: Vec::new(),
        })
    }

    /// Appends one step's line.
    pub fn push(&mut self, m: DrafterStepMetrics) -> Result<(), RlError> {
        let line = serde_json::to_string(&m)
            .map_err(|e| RlError::failed(format!("encoding step metrics: {e}")))?;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(RlError::io(format!("opening {}", self.path.display())))?;
        writeln!(f, "{line}").map_err(RlError::io(format!("writing {}", self.path.display())))?;
        self.steps.push(m);
        Ok(())
    }
}
