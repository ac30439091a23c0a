//! The drafter of an RL run (`[drafter] enabled`): a drafter trainer worker beside the
//! policy's, trained on the hidden states of the rollouts while the engines that finished
//! their share sit idle (`bubble.rs`), and synced to the engines after every weight sync,
//! with speculation switched off while the drafter is not good enough (`sync.rs`).
//!
//! The drafter trainer is trainer rank `N` (after the policy's `N` ranks), a world of its
//! own. Its regions (drafter weights, gradients, optimiser moments, activations) are
//! released whenever it does not train: `init` is followed by an offload of every tag it
//! declares releasable, a bubble onloads them and offloads them again when it ends, so its
//! ledger holds nothing outside `TRAINING`. The hidden states travel inline (through the
//! controller): a rank's share is computed once, when its engine finishes, and replayed for
//! every drafter step of the bubble.
//!
//! A drafter trainer that dies or fails never stops the run: the bubble gives up, the
//! engines stop speculating (`load_drafter("")`), and the run goes on with the drafter off,
//! saying so once (an event `drafter` `off` with the reason, and a progress line).

mod bubble;
mod sync;

pub(super) use bubble::{BubbleCtx, BubbleReport, Finished};

use crate::config::{RlDrafterPlan, TrainIn};
use crate::error::RlError;
use crate::events::EventLog;
use tandem_runtime::launch::{RemoteEngine, RemoteTrainer};

/// Feature rows per drafter step when its trainer does not report its bound.
const DEFAULT_MAX_ROWS: u64 = 4096;

/// Name of the drafter trainer in events and metrics.
pub(super) const NAME: &str = "drafter";

/// The run's drafter: its trainer worker and where it stands.
pub(super) struct Draft {
    remote: RemoteTrainer,
    settings: RlDrafterPlan,
    /// Tags of the drafter trainer that are released outside training.
    tags: Vec<String>,
    /// The layers the drafter reads and the width of one feature row.
    layers: Vec<u32>,
    width: u32,
    /// Most feature rows one drafter step may carry (as its trainer reports it).
    max_rows: u64,
    /// Draft positions the engines propose per round (`k`): acceptance is at most `k + 1`.
    draft_tokens: f64,
    /// The newest exported drafter (directory, version), not yet loaded by the engines.
    exported: Option<(String, u64)>,
    /// The drafter version the engines serve (0: none yet).
    served: u64,
    /// Whether the engines speculate.
    speculating: bool,
    /// The drafter's last predicted acceptance length (from its training accuracies).
    predicted: Option<f64>,
    /// Why the drafter is off for good (its trainer died or failed).
    off: Option<String>,
}

impl Draft {
    /// Initialises the freshly spawned drafter trainer and releases its regions.
    pub(super) fn start(
        remote: RemoteTrainer,
        settings: &RlDrafterPlan,
        events: &EventLog,
    ) -> Result<Draft, RlError> {
        let info = remote.init()?;
        events.record(
            0,
            NAME,
            "init",
            &format!("{} params", info.trainable_params),
        );
        let inputs = crate::algorithm::drafter::drafter_inputs(&remote)?;
        let d = Draft {
            remote,
            settings: settings.clone(),
            tags: settings.trainer.releasable_tags.clone(),
            layers: inputs.layers,
            width: inputs.width,
            max_rows: inputs.max_rows.unwrap_or(DEFAULT_MAX_ROWS),
            draft_tokens: f64::from(settings.draft_tokens),
            exported: None,
            served: 0,
            speculating: false,
            predicted: None,
            off: None,
        };
        d.release(0, events)?;
        Ok(d)
    }

    /// Sizes every engine's hidden-states buffers for the longest sequence it can hold (one
    /// `hidden_states` call of `max_seq_len` tokens, its features dropped), so the bubbles
    /// allocate nothing later (as a drafter job's step 0 does).
    pub(super) fn size_engines(&self, engines: &[RemoteEngine]) -> Result<(), RlError> {
        for e in engines {
            let max_seq = self.settings.max_seq_len as usize;
            if max_seq == 0 {
                continue;
            }
            e.hidden_states(tandem_plugin_api::HiddenStatesRequest {
                sequences: vec![tandem_plugin_api::RVec::from(vec![1u32; max_seq])].into(),
                layers: self.layers.clone().into(),
                adapter: tandem_plugin_api::ROption::RNone,
                route: tandem_plugin_api::FeatureRoute::Inline,
            })?;
        }
        Ok(())
    }

    /// Whether step `step`'s rollout feeds the drafter, and how.
    pub(super) fn trains_at(&self, step: u32) -> Option<TrainIn> {
        let s = &self.settings;
        (self.off.is_none()
            && s.train_in != TrainIn::Off
            && step.is_multiple_of(s.train_every_n_steps.max(1)))
        .then_some(s.train_in)
    }

    /// The drafter trainer's process (chaos, memory figures).
    pub(super) fn pid(&self) -> u32 {
        self.remote.pid()
    }

    /// Its process on this machine, whose memory figures this machine can read.
    pub(super) fn local_pid(&self) -> Option<u32> {
        self.remote.local_pid()
    }

    /// Its region bytes holding memory now (the sum of its `resident_bytes.*`: 0 outside
    /// training), if it answers.
    pub(super) fn ledger(&self) -> Option<u64> {
        let s = self.remote.stats().ok()?;
        Some(crate::metrics::bytes_with_prefix(&s, "resident_bytes."))
    }

    /// Why the drafter trainer's process is dead, once the launcher's monitor reports it
    /// (waiting up to `grace`); `None` when it is alive.
    pub(super) fn death(&self, grace: std::time::Duration) -> Option<String> {
        let deadline = std::time::Instant::now() + grace;
        loop {
            if let Some(why) = self.remote.dead_reason() {
                return Some(why);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Whether the engines speculate now.
    pub(super) fn speculating(&self) -> bool {
        self.speculating
    }

    /// The drafter version the engines serve (0: none).
    pub(super) fn served(&self) -> u64 {
        self.served
    }

    /// Offloads every releasable tag (outside training).
    fn release(&self, step: u32, events: &EventLog) -> Result<(), RlError> {
        if self.tags.is_empty() {
            return Ok(());
        }
        self.remote.offload(&self.tags)?;
        events.record(step, NAME, "offload", &self.tags.join(","));
        Ok(())
    }

    /// Turns the drafter off for the rest of the run: the engines stop speculating. Said
    /// once, in events and on `say`.
    pub(super) fn switch_off_for_good(
        &mut self,
        step: u32,
        why: String,
        engines: &[RemoteEngine],
        events: &EventLog,
        say: &dyn Fn(&str),
    ) {
        if self.off.is_some() {
            return;
        }
        events.record(step, NAME, "off", &why);
        say(&format!(
            "step {step}: the drafter is off for the rest of the run ({why}); the run \
             continues without speculative decoding"
        ));
        self.off = Some(why);
        self.exported = None;
        if self.speculating {
            sync::speculation_off(engines, step, events);
            self.speculating = false;
        }
    }
}
