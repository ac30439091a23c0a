//! The engine's speculative decoding and hidden states (API level 3): a drafter loaded from
//! a directory (`options.drafter` at start, `load_drafter` later) proposes `draft_tokens`
//! tokens per round that the target verifies; `hidden_states` computes the per-position
//! features of given layers and sends them along the request's route.
//!
//! A drafter that cannot be used (missing or corrupt files, a hidden size or vocabulary that
//! does not fit the target) is one error line and changes nothing: at start the engine logs
//! it and serves without speculation; `load_drafter` returns it and keeps the drafter it had.
//! A new drafter of the same shape as the loaded one is read into a spare drafter buffer
//! (allocated with the first drafter) and swapped in once it has loaded completely, so a
//! failed load changes nothing and repeated loads allocate nothing.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tandem_native_core::drafter::{Drafter, DrafterConfig, DrafterRunner, RunnerConfig};
use tandem_native_core::engine::draft::{Draft, DraftInput, DraftModel};
use tandem_native_core::sampling::Rng;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{
    FeatureRoute, HiddenStatesReport, HiddenStatesRequest, LogLevel, Metric, PluginError, RVec,
};

use super::{Inner, NativeEngine, lock};
use crate::common::{Ctx, host_call, log};

/// The loaded drafter, shared between the core engine (which speculates with it) and the
/// glue (which reloads its weights in place).
#[derive(Clone)]
pub(super) struct SharedDrafter {
    runner: Arc<Mutex<DrafterRunner>>,
    /// A buffer of the runner's drafter's shape that the next drafter is read into.
    spare: Arc<Mutex<Drafter>>,
    /// The runner's aux layers and target vocabulary (fixed for its life: a reload in place
    /// keeps the shape), kept outside the lock.
    aux: Vec<usize>,
    vocab: usize,
}

impl SharedDrafter {
    fn new(runner: DrafterRunner, spare: Drafter) -> Self {
        SharedDrafter {
            aux: DraftModel::aux_layers(&runner).to_vec(),
            vocab: DraftModel::target_vocab(&runner),
            runner: Arc::new(Mutex::new(runner)),
            spare: Arc::new(Mutex::new(spare)),
        }
    }

    /// Reads `dir` into the spare and swaps it in; the served drafter changes only if the
    /// whole directory loaded.
    fn load_swap(&self, dir: &Path) -> tandem_native_core::Result<()> {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        spare.load_into(dir)?;
        std::mem::swap(self.runner().drafter_mut(), &mut *spare);
        Ok(())
    }

    fn runner(&self) -> std::sync::MutexGuard<'_, DrafterRunner> {
        self.runner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DraftModel for SharedDrafter {
    fn aux_layers(&self) -> &[usize] {
        &self.aux
    }
    fn target_vocab(&self) -> usize {
        self.vocab
    }
    fn propose(
        &mut self,
        rows: &[DraftInput<'_>],
        k: usize,
        rngs: &mut [Rng],
    ) -> tandem_native_core::Result<Vec<Draft>> {
        self.runner().propose(rows, k, rngs)
    }
}

/// Counters of the hidden states sent since start.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct HiddenCounters {
    pub calls: u64,
    pub rows: u64,
    pub bytes_sent: u64,
    pub send_s: f64,
}

impl NativeEngine {
    /// Loads the drafter in `dir` (see the module doc); the engine's lock is held.
    pub(super) fn load_drafter_locked(&self, inner: &mut Inner, dir: &Path) -> Result<()> {
        let what = format!("engine `native`: drafter {}", dir.display());
        if let Some(shared) = &inner.drafter {
            let incoming = DrafterConfig::from_dir(dir, None).ctx(&what)?;
            let same_shape = shared.runner().drafter().cfg == incoming;
            if same_shape {
                return shared.load_swap(dir).ctx(&what);
            }
        }
        let drafter =
            Drafter::load(dir, Some(&inner.engine.model), &mut inner.provider).ctx(&what)?;
        let spare = drafter.try_clone(&mut inner.provider).ctx(&what)?;
        let cfg = inner.engine.config();
        let runner = DrafterRunner::new(
            drafter,
            RunnerConfig {
                max_batch: cfg.max_batch,
                max_seq: cfg.max_seq,
            },
            &mut inner.provider,
        )
        .ctx(&what)?;
        let shared = SharedDrafter::new(runner, spare);
        inner
            .engine
            .set_drafter(Some((Box::new(shared.clone()), inner.draft_tokens)))
            .ctx(&what)?;
        inner.drafter = Some(shared);
        Ok(())
    }

    /// `options.drafter` at start: used if it loads, else one warning and no speculation.
    pub(super) fn load_initial_drafter(&self, dir: &Path) {
        let mut inner = lock(&self.inner);
        match self.load_drafter_locked(&mut inner, dir) {
            Ok(()) => log(
                &self.host,
                LogLevel::Info,
                &format!(
                    "engine: speculative decoding with drafter {} ({} draft tokens)",
                    dir.display(),
                    inner.draft_tokens
                ),
            ),
            Err(e) => log(
                &self.host,
                LogLevel::Warn,
                &format!(
                    "{}; serving without speculative decoding (fix the drafter or remove \
                     [engine.options] drafter)",
                    e.message
                ),
            ),
        }
    }

    /// `load_drafter`: a directory loads (see the module doc) and speculation is on; an empty
    /// `dir` turns speculation off and keeps the drafter's buffers, so the next load swaps in
    /// place again.
    pub(super) fn load_drafter_dir(&self, dir: &str) -> Result<()> {
        let mut inner = lock(&self.inner);
        if dir.is_empty() {
            // The core engine hands back its handle of the shared drafter; the glue keeps one.
            drop(
                inner
                    .engine
                    .set_drafter(None)
                    .ctx("engine `native`: speculation off")?,
            );
            inner.drafter_off = inner.drafter.is_some();
            return Ok(());
        }
        self.load_drafter_locked(&mut inner, Path::new(dir))?;
        if inner.drafter_off
            && let Some(shared) = inner.drafter.clone()
        {
            let k = inner.draft_tokens;
            inner
                .engine
                .set_drafter(Some((Box::new(shared), k)))
                .ctx("engine `native`: speculation back on")?;
        }
        inner.drafter_off = false;
        Ok(())
    }

    /// `hidden_states`: one forward over the sequences, the rows sent along the route.
    pub(super) fn run_hidden_states(
        &self,
        request: &HiddenStatesRequest,
    ) -> Result<HiddenStatesReport> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let layers: Vec<usize> = request.layers.iter().map(|&l| l as usize).collect();
        if layers.is_empty() {
            return Err(PluginError::invalid_input(
                "hidden_states: no layers requested",
            ));
        }
        let max_seq = inner.engine.config().max_seq;
        let seqs: Vec<Vec<u32>> = request.sequences.iter().map(|s| s.to_vec()).collect();
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() || s.len() > max_seq {
                return Err(PluginError::invalid_input(format!(
                    "hidden_states: sequence {i} has {} tokens (1..={max_seq} allowed)",
                    s.len()
                )));
            }
        }
        let adapter = request
            .adapter
            .as_ref()
            .map(|a| a.to_string())
            .into_option();
        let per_seq = inner
            .engine
            .aux_features(&seqs, &layers, adapter.as_deref(), &mut inner.provider)
            .ctx("hidden_states")?;
        let width = layers.len() * inner.engine.model.cfg.hidden_size;
        let rows: usize = seqs.iter().map(Vec::len).sum();
        let buf = &mut inner.feature_buf;
        buf.clear();
        for f in &per_seq {
            buf.extend_from_slice(f);
        }
        drop(per_seq);
        let mut report = HiddenStatesReport {
            rows: rows as u64,
            width: width as u32,
            bytes_sent: 0,
            features: RVec::new(),
        };
        match &request.route {
            FeatureRoute::Inline => report.features = RVec::from(buf.clone()),
            FeatureRoute::Transport { group, peer, tag } => {
                let bytes: &[u8] = bytemuck::cast_slice(buf.as_slice());
                let t = Instant::now();
                host_call(
                    self.host
                        .send(group.as_str().into(), *peer, bytes.into(), *tag),
                    &format!("hidden_states: sending to rank {peer} of {group}"),
                )?;
                inner.hidden.send_s += t.elapsed().as_secs_f64();
                report.bytes_sent = bytes.len() as u64;
            }
        }
        inner.hidden.calls += 1;
        inner.hidden.rows += rows as u64;
        inner.hidden.bytes_sent += report.bytes_sent;
        Ok(report)
    }

    /// The speculative-decoding and hidden-state figures of `stats`.
    pub(super) fn spec_metrics(inner: &Inner) -> Vec<Metric> {
        let s = inner.engine.spec_stats();
        let h = inner.hidden;
        vec![
            Metric::new("spec.drafter", inner.drafter.is_some() as u8 as f64),
            Metric::new(
                "spec.on",
                (inner.drafter.is_some() && !inner.drafter_off) as u8 as f64,
            ),
            Metric::new("spec.draft_tokens", inner.draft_tokens as f64),
            Metric::new("spec.rounds", s.rounds as f64),
            Metric::new("spec.drafted", s.drafted as f64),
            Metric::new("spec.accepted", s.accepted as f64),
            Metric::new("spec.emitted", s.emitted as f64),
            Metric::new("spec.mean_accept_len", s.mean_accept_len()),
            Metric::new("spec.verifies", s.verifies as f64),
            Metric::new("spec.plain", s.plain as f64),
            Metric::new("spec.draft_s", s.draft_ns as f64 * 1e-9),
            Metric::new("spec.verify_s", s.verify_ns as f64 * 1e-9),
            Metric::new("hidden_states.calls", h.calls as f64),
            Metric::new("hidden_states.rows", h.rows as f64),
            Metric::new("hidden_states.bytes_sent", h.bytes_sent as f64),
            Metric::new("hidden_states.send_s", h.send_s),
        ]
    }
}
