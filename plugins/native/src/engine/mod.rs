//! The `native` engine component: [`EngineImpl`] over the core [`Engine`] behind a mutex,
//! plus its lifecycle state (the shared state machine), in-flight count and abort flag.
//!
//! Concurrency: `generate` registers itself as in flight, then runs its prompts in chunks
//! of `max_batch`, taking the core lock per chunk; `pause_generation(abort)` makes the
//! remaining chunks return [`FinishReason::Aborted`] (a chunk already decoding finishes), and
//! both pause modes return once nothing is in flight. Which lifecycle call is legal when is
//! decided by the shared [`EngineMachine`] (the host checks the same machine, and
//! `tandem-conformance` holds this engine to it): requests arriving while not serving fail with
//! `InvalidState`, flush only right after a pause, a tag is released once and resumed once,
//! updates only while paused with the weights resident and never to a lower version. Released
//! tags must be resumed before serving continues: no code touches a paused region.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use serde::Deserialize;
use tandem_native_core::buffer::BufferTag;
use tandem_native_core::engine::{Engine, EngineConfig};
use tandem_native_core::model::Model;
use tandem_plugin_api::lifecycle::{EngineMachine, TransitionError};
use tandem_plugin_api::sdk::{EngineImpl, Result};
use tandem_plugin_api::{
    ComponentConfig, ComponentStats, EngineHealth, GenerateRequest, GenerateResponse,
    HiddenStatesReport, HiddenStatesRequest, HostBox, LogLevel, Metric, PauseMode, PluginError,
    RString, RVec, UpdateReport, WeightUpdate,
};

mod bucket_stream;
mod buckets;
mod generate;
mod spec;
mod update;

use super::common::{Ctx, check_tags, host_call, log, parse_options};
use super::provider::{Backing, PluginProvider};
use tandem_plugin_api::files::state::saved_version;

/// Tags the engine can release (their regions come back at the same address).
pub const RELEASABLE: [&str; 3] = ["weights", "kv_cache", "activations"];

/// `options` of the engine component.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineOptions {
    /// Sequences decoded together (KV cache slots).
    pub max_batch: usize,
    /// Longest prompt + completion (KV cache length); capped by the model's RoPE table.
    pub max_seq_len: usize,
    /// A drafter directory (EAGLE-3, e.g. a `native-drafter` checkpoint) to decode
    /// speculatively with; `load_drafter` can replace it later.
    pub drafter: Option<String>,
    /// Draft tokens proposed per speculative round.
    pub draft_tokens: usize,
    /// Speculate only while at most this many sequences decode together (the long tail of a
    /// batch); above it, plain decoding. Unset: every round speculates.
    pub speculate_below_batch: Option<usize>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_batch: 8,
            max_seq_len: 1024,
            drafter: None,
            draft_tokens: 4,
            speculate_below_batch: None,
        }
    }
}

struct Inner {
    engine: Engine,
    provider: PluginProvider,
    weight_version: u64,
    /// Directory the served base weights were last loaded from.
    served_dir: PathBuf,
    /// Key of the trainer's region the base weights are served from (`ipc`), if attached.
    shared: Option<String>,
    /// Adapter used when a request names none (set by adapter updates).
    active_adapter: Option<String>,
    /// The buffer of the adapter the last adapter update replaced: the next update of the
    /// same shape loads into it (already-mapped pages) instead of a fresh region.
    spare_adapter: Option<Box<dyn tandem_native_core::buffer::Region>>,
    /// The drafter speculative decoding uses, if one is loaded.
    drafter: Option<spec::SharedDrafter>,
    /// Speculation was turned off (`load_drafter("")`): the drafter is kept but not used.
    drafter_off: bool,
    /// Draft tokens per round.
    draft_tokens: usize,
    /// The last `hidden_states` rows, concatenated (kept: it grows to its peak once).
    feature_buf: Vec<f32>,
    /// Hidden states sent since start.
    hidden: spec::HiddenCounters,
    /// The two buffers `TensorBuckets` updates receive buckets into (they grow to the largest
    /// bucket once, kept across syncs).
    bucket_bufs: [Vec<f32>; 2],
}

struct State {
    machine: EngineMachine,
    abort: bool,
    in_flight: usize,
}

fn illegal(e: TransitionError) -> PluginError {
    PluginError::invalid_state(format!("engine `native`: {e}"))
}

/// The engine component.
pub struct NativeEngine {
    inner: Mutex<Inner>,
    state: Mutex<State>,
    idle: Condvar,
    host: HostBox,
    model_dir: PathBuf,
    /// Why the served weights cannot be trusted (a checkpoint read in place failed half-way):
    /// generation and scoring refuse until a weight update loads completely. Never held while
    /// another lock is taken.
    damaged: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl NativeEngine {
    /// Loads the model of `config.model_path` and allocates the KV cache.
    pub fn new(config: &ComponentConfig, host: HostBox) -> Result<Self> {
        let opts: EngineOptions = parse_options(&config.options_json, "engine `native`")?;
        let dir = PathBuf::from(config.model_path.as_str());
        if config.model_path.is_empty() {
            return Err(PluginError::invalid_input(
                "engine `native` needs a model directory (model_path is empty)",
            ));
        }
        let mut provider = PluginProvider::new(host.clone(), "engine").ctx("engine `native`")?;
        let what = format!("loading model {}", dir.display());
        let model = Model::load(&dir, &mut provider).ctx(&what)?;
        let max_seq = opts.max_seq_len.min(model.rope.max_pos());
        let cfg = EngineConfig {
            max_batch: opts.max_batch,
            max_seq,
        };
        let mut engine = Engine::new(model, cfg, &mut provider).ctx("engine `native` options")?;
        engine.set_speculate_below_batch(opts.speculate_below_batch);
        log(
            &host,
            LogLevel::Info,
            &format!(
                "engine: {} loaded (max_batch {}, max_seq {max_seq}, buffers: {})",
                dir.display(),
                cfg.max_batch,
                provider.backing().as_str()
            ),
        );
        // A checkpoint exported by the trainer carries its version: it survives the engine's
        // restart on it.
        let version = saved_version(&dir).unwrap_or(0);
        let engine = NativeEngine {
            inner: Mutex::new(Inner {
                engine,
                provider,
                weight_version: version,
                served_dir: dir.clone(),
                shared: None,
                active_adapter: None,
                spare_adapter: None,
                drafter: None,
                drafter_off: false,
                draft_tokens: opts.draft_tokens,
                feature_buf: Vec::new(),
                hidden: spec::HiddenCounters::default(),
                bucket_bufs: [Vec::new(), Vec::new()],
            }),
            state: Mutex::new(State {
                machine: EngineMachine::new(version),
                abort: false,
                in_flight: 0,
            }),
            idle: Condvar::new(),
            damaged: Mutex::new(None),
            host,
            model_dir: dir,
        };
        if let Some(d) = &opts.drafter {
            engine.load_initial_drafter(Path::new(d));
        }
        Ok(engine)
    }

    fn begin(&self) -> Result<()> {
        if let Some(why) = lock(&self.damaged).clone() {
            return Err(PluginError::invalid_state(format!(
                "engine `native` serves damaged weights: {why}"
            ))
            .with_help("apply a weight update that loads completely, or restart the engine"));
        }
        let mut st = lock(&self.state);
        if !st.machine.can_generate() {
            return Err(PluginError::invalid_state(format!(
                "engine `native` is {}, not serving; call continue_generation (after \
                 resume_memory of every released tag) first",
                st.machine.state()
            )));
        }
        st.in_flight += 1;
        Ok(())
    }

    fn end(&self) {
        let mut st = lock(&self.state);
        st.in_flight -= 1;
        if st.in_flight == 0 {
            self.idle.notify_all();
        }
    }

    fn aborted(&self) -> bool {
        lock(&self.state).abort
    }
}

fn strings(tags: &[String]) -> RVec<RString> {
    tags.iter().map(|t| RString::from(t.as_str())).collect()
}

impl EngineImpl for NativeEngine {
    fn component(&self) -> &str {
        "native"
    }

    fn health(&self) -> Result<EngineHealth> {
        let st = lock(&self.state);
        let version = lock(&self.inner).weight_version;
        let damaged = lock(&self.damaged).is_some();
        Ok(EngineHealth {
            ready: st.machine.can_generate() && !damaged,
            weight_version: version,
            detail: format!(
                "{}{} ({})",
                state_name(&st),
                if damaged { ", weights damaged" } else { "" },
                self.model_dir.display()
            )
            .into(),
        })
    }

    fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse> {
        self.begin()?;
        let out = self.run_generate(&request);
        self.end();
        out
    }

    fn score(&self, sequences: Vec<RVec<u32>>) -> Result<Vec<RVec<f32>>> {
        self.begin()?;
        let out = (|| {
            let mut guard = lock(&self.inner);
            let inner = &mut *guard;
            let mut out = Vec::with_capacity(sequences.len());
            for (i, s) in sequences.iter().enumerate() {
                if s.len() > inner.engine.config().max_seq {
                    return Err(PluginError::invalid_input(format!(
                        "score: sequence {i} has {} tokens, more than max_seq_len {}",
                        s.len(),
                        inner.engine.config().max_seq
                    )));
                }
                inner.engine.model.check_tokens(s).ctx("score")?;
                let active = inner.active_adapter.clone();
                let lp = inner
                    .engine
                    .score(s, active.as_deref(), &mut inner.provider)
                    .ctx("score")?;
                out.push(lp.into_iter().skip(1).collect());
            }
            Ok(out)
        })();
        self.end();
        out
    }

    fn pause_generation(&self, mode: PauseMode) -> Result<()> {
        if mode == PauseMode::Keep {
            return Err(PluginError::not_supported(
                "pause_generation(keep)",
                "native",
            ));
        }
        let mut st = lock(&self.state);
        st.machine.pause().map_err(illegal)?;
        st.abort = mode == PauseMode::Abort;
        while st.in_flight > 0 {
            st = self.idle.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        Ok(())
    }

    fn continue_generation(&self) -> Result<()> {
        let mut st = lock(&self.state);
        st.machine.continue_generation().map_err(illegal)?;
        st.abort = false;
        Ok(())
    }

    fn flush_cache(&self) -> Result<()> {
        // Lock order everywhere: state, then inner. Flush is legal only right after a pause,
        // so no region is released here.
        let mut st = lock(&self.state);
        let mut next = st.machine.clone();
        next.flush().map_err(illegal)?;
        lock(&self.inner).engine.flush_cache();
        st.machine = next;
        Ok(())
    }

    fn release_memory(&self, tags: Vec<String>) -> Result<()> {
        check_tags(&tags, &RELEASABLE, "release_memory")?;
        // Lock order everywhere: state, then inner.
        let mut st = lock(&self.state);
        let mut next = st.machine.clone();
        next.release(&tags).map_err(illegal)?;
        let inner = lock(&self.inner);
        if inner.provider.backing() != Backing::Host {
            return Err(not_host("release_memory"));
        }
        if let Some(key) = &inner.shared
            && tags.iter().any(|t| t == "weights")
        {
            return Err(PluginError::invalid_state(format!(
                "release_memory: `weights` are the trainer's region {key} mapped in place (ipc \
                 bridge); the engine holds no copy of its own to release"
            ))
            .with_help("release only kv_cache and activations with the ipc bridge"));
        }
        host_call(self.host.pause_tags(strings(&tags)), "release_memory")?;
        st.machine = next;
        drop(inner);
        Ok(())
    }

    fn resume_memory(&self, tags: Vec<String>) -> Result<()> {
        check_tags(&tags, &RELEASABLE, "resume_memory")?;
        let mut st = lock(&self.state);
        let mut next = st.machine.clone();
        next.resume(&tags).map_err(illegal)?;
        let inner = lock(&self.inner);
        if inner.provider.backing() != Backing::Host {
            return Err(not_host("resume_memory"));
        }
        host_call(self.host.resume_tags(strings(&tags)), "resume_memory")?;
        st.machine = next;
        drop(inner);
        Ok(())
    }

    fn apply_weight_update(&self, update: WeightUpdate) -> Result<UpdateReport> {
        // The machine is `Updating` while the update runs (outside the state lock: it reads
        // files for a while), so concurrent lifecycle calls are refused meanwhile.
        lock(&self.state)
            .machine
            .begin_update(update.version)
            .map_err(illegal)?;
        let result = self.apply(update);
        lock(&self.state).machine.finish_update(result.is_ok());
        result
    }

    fn load_adapter(&self, name: String, dir: String) -> Result<()> {
        self.add_adapter(&name, Path::new(&dir)).map(drop)
    }

    fn unload_adapter(&self, name: String) -> Result<()> {
        let mut inner = lock(&self.inner);
        if inner.engine.remove_adapter(&name) {
            // Unloading the active adapter reverts requests naming none to the base weights.
            if inner.active_adapter.as_deref() == Some(name.as_str()) {
                inner.active_adapter = None;
            }
            Ok(())
        } else {
            Err(PluginError::invalid_input(format!(
                "unload_adapter: no adapter named `{name}` is loaded"
            )))
        }
    }

    fn hidden_states(&self, request: HiddenStatesRequest) -> Result<HiddenStatesReport> {
        self.begin()?;
        let out = self.run_hidden_states(&request);
        self.end();
        out
    }

    fn load_drafter(&self, dir: String) -> Result<()> {
        self.load_drafter_dir(&dir)
    }

    fn stats(&self) -> Result<ComponentStats> {
        let st = lock(&self.state);
        let inner = lock(&self.inner);
        let cfg = inner.engine.config();
        let p = &inner.provider;
        let mut metrics = vec![
            Metric::new("host_regions", (p.backing() == Backing::Host) as u8 as f64),
            Metric::new("max_batch", cfg.max_batch as f64),
            Metric::new("max_seq_len", cfg.max_seq as f64),
            Metric::new("adapters", inner.engine.adapter_names().len() as f64),
            Metric::new("shared_weights", inner.shared.is_some() as u8 as f64),
            Metric::new("in_flight", st.in_flight as f64),
        ];
        for tag in [
            BufferTag::Weights,
            BufferTag::KvCache,
            BufferTag::Activations,
        ] {
            metrics.push(Metric::new(
                &format!("allocated_bytes.{}", tag.as_str()),
                p.bytes(tag) as f64,
            ));
        }
        metrics.extend(Self::spec_metrics(&inner));
        Ok(ComponentStats {
            weight_version: inner.weight_version,
            state: state_name(&st).into(),
            metrics: metrics.into(),
        })
    }
}

fn state_name(st: &State) -> String {
    st.machine.state().to_string().to_lowercase()
}

fn not_host(op: &str) -> PluginError {
    PluginError::new(
        tandem_plugin_api::ErrorCode::NotAvailable,
        format!("{op}: this engine's buffers are heap vectors (no host memory services)"),
    )
    .with_help("run the engine inside a `tandem worker` process, which attaches memory services")
}
