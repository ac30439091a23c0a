//! Options of the `native-drafter` trainer component.

use serde::Deserialize;
use tandem_native_core::optim::AdamW;
use tandem_plugin_api::ConfigProblem;

use crate::common::CheckOptions;

/// `options` of the `native-drafter` trainer (the learning rate and clip come with each step).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrafterOptions {
    /// Start from this drafter directory (a drafter checkpoint) instead of a fresh drafter
    /// initialised from the target.
    pub drafter: Option<String>,
    /// Training-time-test steps: draft positions trained per step (EAGLE-3 unrolls the
    /// drafter on its own predictions this many times).
    pub ttt_steps: usize,
    /// Target layers whose input residual streams feed the drafter (three ids below the
    /// target's layer count); default: vLLM's `(2, L/2, L-3)` where distinct, else
    /// `(1, L/2, L-1)`.
    pub aux_layers: Option<[usize; 3]>,
    /// Most feature rows (positions, summed over the batch's sequences) one step may carry:
    /// the receive region and the activations are sized for it at init, and the trainer
    /// warms up at that size.
    pub max_tokens: usize,
    /// Seed of the fresh drafter's initialisation.
    pub seed: u64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// AdamW β1.
    pub beta1: f32,
    /// AdamW β2.
    pub beta2: f32,
    /// AdamW ε.
    pub eps: f32,
}

impl Default for DrafterOptions {
    fn default() -> Self {
        let a = AdamW::default();
        DrafterOptions {
            drafter: None,
            ttt_steps: 4,
            aux_layers: None,
            max_tokens: 4096,
            seed: 0,
            weight_decay: 0.0,
            beta1: a.beta1,
            beta2: a.beta2,
            eps: a.eps,
        }
    }
}

impl CheckOptions for DrafterOptions {
    fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if self.ttt_steps == 0 {
            p.push(
                ConfigProblem::new("ttt_steps", "must be at least 1")
                    .with_help("EAGLE-3 trains each draft position it will propose: e.g. 4"),
            );
        }
        if self.max_tokens == 0 {
            p.push(ConfigProblem::new("max_tokens", "must be at least 1"));
        }
        for (key, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                p.push(ConfigProblem::new(
                    key,
                    format!("must be in [0, 1), got {beta}"),
                ));
            }
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            p.push(ConfigProblem::new(
                "eps",
                format!("must be > 0, got {}", self.eps),
            ));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            p.push(ConfigProblem::new(
                "weight_decay",
                format!("must be >= 0, got {}", self.weight_decay),
            ));
        }
        p
    }
}
