//! The pool: `workers` Python processes that load one reward function or one environment
//! class, and the calls that go to them.
//!
//! `score` splits a batch into one contiguous chunk per worker and scores the chunks in
//! parallel (a scoped thread per chunk); the worker calls a batched function (TRL's signature,
//! an environment's `score`) once per chunk, a per-sample function (verl's) in a loop, and an
//! `async` one concurrently over the chunk, answering one line per call. The timeout is per call of the user's function and restarts at
//! each answer. When a call times out or the worker dies, the samples of that call fail with
//! the reason, the worker is killed and a fresh one started in its slot; for a per-sample
//! function the rest of the chunk is retried once on the fresh worker (a second fault in the
//! same chunk fails what is left, so a reward that hangs on every sample costs one timeout
//! per chunk twice, not one per sample).

use super::verdict::Entry;
use super::worker::{Fault, Launch, Worker};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tandem_plugin_api::PluginError;

/// What the workers load.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A reward function, `module:function`.
    Reward(String),
    /// An environment class, `module:Class`, built with these keyword arguments.
    Env {
        /// `module:Class`.
        class: String,
        /// Keyword arguments (a JSON object).
        kwargs: Value,
    },
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Reward(f) => format!("Python reward `{f}`"),
            Target::Env { class, .. } => format!("Python environment `{class}`"),
        }
    }

    fn name(&self) -> &str {
        match self {
            Target::Reward(f) => f,
            Target::Env { class, .. } => class,
        }
    }
}

/// Everything a pool is started from.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    /// The interpreter.
    pub python: PathBuf,
    /// Worker processes (at least 1).
    pub workers: usize,
    /// Timeout of one call of the user's code.
    pub timeout: Duration,
    /// Timeout of a worker's start (the import of the user's module and the class's
    /// constructor).
    pub start_timeout: Duration,
    /// Address-space limit of each worker (RLIMIT_AS, set before user code is imported).
    pub memory_mb: Option<u64>,
    /// CPU seconds one call may use (RLIMIT_CPU, moved before each call).
    pub cpu_s: Option<u64>,
    /// Put first on `sys.path`, in order.
    pub path: Vec<PathBuf>,
    /// What to load.
    pub target: Target,
    /// Where the worker script and the logs go (created).
    pub dir: PathBuf,
}

/// The kind of the loaded target, as the worker detected it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// verl's `(data_source, solution_str, ground_truth, extra_info)`: one call per sample.
    Verl,
    /// verl's signature, `async def`: a chunk's samples run concurrently, answered at once.
    VerlAsync,
    /// TRL's `(prompts, completions, **kwargs)`: one call per chunk.
    Trl,
    /// An environment class: `score` once per chunk.
    Env,
}

/// A started pool. Dropping it kills its workers.
pub struct Pool {
    spec: PoolSpec,
    script: PathBuf,
    slots: Vec<Mutex<Option<Worker>>>,
    kind: Kind,
    describe: Value,
    restarts: AtomicU64,
    next_item: AtomicUsize,
}

/// One sample's outcome: an entry from the user's code, or why there is none.
pub type Outcome = Result<Entry, String>;

impl Pool {
    /// Writes the worker script into `spec.dir` and starts every worker (in parallel); an
    /// import error, a bad signature or a constructor that raises is an error naming it.
    pub fn start(spec: PoolSpec) -> Result<Pool, PluginError> {
        let script = super::files::install(&spec.dir)?;
        let workers = spec.workers.max(1);
        let started: Vec<Result<(Worker, Kind, Value), PluginError>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|k| {
                    let (spec, script) = (&spec, &script);
                    s.spawn(move || start_worker(spec, script, k))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(PluginError::runtime("a worker's start panicked")))
                })
                .collect()
        });
        let mut slots = Vec::with_capacity(workers);
        let mut first = None;
        for r in started {
            let (w, kind, describe) = r?;
            first.get_or_insert((kind, describe));
            slots.push(Mutex::new(Some(w)));
        }
        let (kind, describe) =
            first.ok_or_else(|| PluginError::runtime("the pool started no worker"))?;
        Ok(Pool {
            spec,
            script,
            slots,
            kind,
            describe,
            restarts: AtomicU64::new(0),
            next_item: AtomicUsize::new(0),
        })
    }

    /// What the workers loaded.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// An environment class's `describe()` (`null` for a reward function).
    pub fn describe(&self) -> &Value {
        &self.describe
    }

    /// Workers replaced so far (after a timeout or a death).
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Process ids of the live workers, by slot (`None`: replaced lazily at its next call).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.slots
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map(Worker::pid)
            })
            .collect()
    }

    /// One outcome per sample (each `{"item": …, "completion": …}`), in order.
    pub fn score(&self, samples: &[Value]) -> Vec<Outcome> {
        let n = samples.len();
        if n == 0 {
            return Vec::new();
        }
        let chunks = self.slots.len().min(n);
        let (base, extra) = (n / chunks, n % chunks);
        let mut bounds = Vec::with_capacity(chunks);
        let mut at = 0;
        for k in 0..chunks {
            let len = base + usize::from(k < extra);
            bounds.push((at, at + len));
            at += len;
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = bounds
                .iter()
                .enumerate()
                .map(|(k, &(a, b))| s.spawn(move || self.score_chunk(k, &samples[a..b])))
                .collect();
            let mut out = Vec::with_capacity(n);
            for (h, &(a, b)) in handles.into_iter().zip(&bounds) {
                match h.join() {
                    Ok(r) => out.extend(r),
                    Err(_) => out.extend((a..b).map(|_| Err("scoring panicked".to_string()))),
                }
            }
            out
        })
    }

    fn score_chunk(&self, slot: usize, samples: &[Value]) -> Vec<Outcome> {
        let mut out: Vec<Option<Outcome>> = vec![None; samples.len()];
        let mut faults = 0;
        let mut guard = self.slots[slot]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while let Some(next) = out.iter().position(Option::is_none) {
            let worker = match self.ensure(slot, &mut guard) {
                Ok(w) => w,
                Err(reason) => {
                    fill(&mut out[next..], &reason);
                    break;
                }
            };
            let Err(fault) = run_score(
                worker,
                &samples[next..],
                &mut out[next..],
                self.spec.timeout,
            ) else {
                let reason = "the worker answered no result for this sample";
                fill(&mut out[next..], reason);
                break;
            };
            let reason = fault.reason(&worker.log);
            worker.kill();
            *guard = None;
            faults += 1;
            // The call in flight: one sample for verl, the rest of the chunk otherwise.
            let Some(at) = out.iter().position(Option::is_none) else {
                break;
            };
            if self.kind == Kind::Verl && faults < 2 {
                out[at] = Some(Err(reason));
            } else {
                fill(&mut out[at..], &reason);
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err("not scored".into())))
            .collect()
    }

    /// The slot's worker, started afresh when it was killed.
    fn ensure<'a>(
        &self,
        slot: usize,
        guard: &'a mut Option<Worker>,
    ) -> Result<&'a mut Worker, String> {
        if guard.is_none() {
            let (w, _, _) = start_worker(&self.spec, &self.script, slot)
                .map_err(|e| format!("no worker: a replacement did not start: {e}"))?;
            self.restarts.fetch_add(1, Ordering::Relaxed);
            *guard = Some(w);
        }
        guard.as_mut().ok_or_else(|| "no worker".to_string())
    }

    /// Sends one request expecting one answer (an environment's `item`), to the next slot.
    pub fn request(&self, request: &Value) -> Result<Value, PluginError> {
        let slot = self.next_item.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut guard = self.slots[slot]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let worker = self
            .ensure(slot, &mut guard)
            .map_err(PluginError::runtime)?;
        let answer = worker
            .send(request)
            .and_then(|()| worker.recv(self.spec.timeout));
        match answer {
            Ok(v) => Ok(v),
            Err(fault) => {
                let reason = fault.reason(&worker.log);
                worker.kill();
                *guard = None;
                Err(PluginError::runtime(format!(
                    "{}: {reason}",
                    self.spec.target.describe()
                )))
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Every worker sees EOF first, then each is reaped (killed if still busy).
        for slot in &mut self.slots {
            let worker = slot.get_mut().unwrap_or_else(PoisonError::into_inner);
            if let Some(w) = worker.as_mut() {
                w.close_input();
            }
        }
    }
}

fn fill(out: &mut [Option<Outcome>], reason: &str) {
    for o in out.iter_mut().filter(|o| o.is_none()) {
        *o = Some(Err(reason.to_string()));
    }
}

/// Sends `samples` to `worker` and fills `out` from its answers; `Ok` at `done`.
fn run_score(
    worker: &mut Worker,
    samples: &[Value],
    out: &mut [Option<Outcome>],
    timeout: Duration,
) -> Result<(), Fault> {
    worker.send(&json!({"op": "score", "samples": samples}))?;
    loop {
        let line = worker.recv(timeout)?;
        if line.get("done").is_some() {
            return Ok(());
        }
        let at = line.get("at").and_then(Value::as_u64).map(|a| a as usize);
        if let Some(err) = line.get("error") {
            let reason = err.as_str().unwrap_or("the call failed").to_string();
            let from = at.unwrap_or(0).min(out.len());
            fill(&mut out[from..], &reason);
            if at.is_none() {
                return Ok(());
            }
            continue;
        }
        let (Some(at), Some(results)) = (at, line.get("results").and_then(Value::as_array)) else {
            return Err(Fault::Protocol(format!("unexpected answer {line}")));
        };
        if at + results.len() > out.len() {
            return Err(Fault::Protocol(format!(
                "{} results at {at} for {} samples",
                results.len(),
                out.len()
            )));
        }
        for (slot, r) in out[at..].iter_mut().zip(results) {
            *slot = Some(Entry::from_json(r));
        }
    }
}

/// Starts worker `k` and sends `init`; the answer's kind and `describe`.
fn start_worker(
    spec: &PoolSpec,
    script: &std::path::Path,
    k: usize,
) -> Result<(Worker, Kind, Value), PluginError> {
    let what = spec.target.describe();
    let log = spec.dir.join(format!(
        "{}-{k}.log",
        super::files::label(spec.target.name())
    ));
    let launch = Launch {
        python: &spec.python,
        script,
        log: log.clone(),
    };
    let mut w = Worker::spawn(&launch).map_err(|e| {
        PluginError::invalid_input(format!(
            "{what}: cannot start Python `{}`: {e}",
            spec.python.display()
        ))
        .with_help("set the `python` option or $TANDEM_PYTHON to an interpreter, or run `bash scripts/setup.sh`")
    })?;
    let (reward, env) = match &spec.target {
        Target::Reward(f) => (json!(f), Value::Null),
        Target::Env { class, kwargs } => (Value::Null, json!({"class": class, "kwargs": kwargs})),
    };
    let init = json!({
        "op": "init",
        "path": spec.path,
        "memory_mb": spec.memory_mb,
        "cpu_s": spec.cpu_s,
        "reward": reward,
        "env": env,
    });
    let answer = w.send(&init).and_then(|()| w.recv(spec.start_timeout));
    let failed = |reason: String| {
        PluginError::invalid_input(format!("{what} did not start: {reason}")).with_help(format!(
            "the module is looked up in the job file's directory, `python_path` and the \
             interpreter's site-packages; the worker's log: {}",
            log.display()
        ))
    };
    let answer = answer.map_err(|f| failed(f.reason(&log)))?;
    if let Some(err) = answer.get("error") {
        return Err(failed(err.as_str().unwrap_or("unknown error").to_string()));
    }
    let ok = answer
        .get("ok")
        .ok_or_else(|| failed(format!("unexpected answer {answer}")))?;
    let kind = match ok.get("kind").and_then(Value::as_str) {
        Some("verl") => Kind::Verl,
        Some("verl_async") => Kind::VerlAsync,
        Some("trl") => Kind::Trl,
        Some("env") => Kind::Env,
        other => return Err(failed(format!("unknown kind {other:?}"))),
    };
    Ok((w, kind, ok.get("describe").cloned().unwrap_or(Value::Null)))
}
