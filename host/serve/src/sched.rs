//! The dynamic batcher: one queue of sequences and one engine thread.
//!
//! HTTP handlers [`Server::submit`] jobs (one per sequence) and read their [`Event`]s from a
//! channel. The engine thread waits until the queue holds work and the server may dispatch
//! (not paused by a client, no control operation holding the engine, the engine serving),
//! takes the first job plus **every queued job compatible with it** (same sampling
//! parameters, stop ids, adapter and per-call token budget) and runs them as ONE engine
//! `generate` call; the engine decodes them with continuous batching over its `max_batch`
//! slots. Requests arriving together are therefore batched, and a request arriving while the
//! engine is busy waits for the next call.
//!
//! Streaming jobs carry a `chunk` (SGLang's `stream_interval`): each call generates at most
//! that many tokens, the job's tokens are sent, and an unfinished job goes back to the front
//! of the queue, its next call continuing from prompt + tokens so far (a re-prefill: the
//! native engine keeps no KV cache between calls). Between chunks a job is "started": a
//! client pause in `in_place` mode keeps it (SGLang's running requests keep their KV cache,
//! which is what makes `flush_cache` refuse), `retract` counts it as waiting again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tandem_plugin_api::lifecycle::EngineMachine;
use tandem_plugin_api::{
    Completion, EngineBox, ErrorCode, FinishReason, GenerateRequest, ROption, RString, RVec,
    SamplingParams,
};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Why a sequence finished (SGLang's `finish_reason` types).
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// A stop token (the id) was generated.
    Stop(u32),
    /// The token budget (or the engine's context) was reached.
    Length,
    /// Aborted (`/abort_request`, `/pause_generation` in abort mode, shutdown).
    Abort(String),
}

/// What a job's channel carries.
#[derive(Debug, Clone)]
pub enum Event {
    /// New tokens and their logprobs.
    Tokens(Vec<u32>, Vec<f32>),
    /// The sequence finished, under weights of this engine version.
    Done(Finish, u64),
    /// The engine failed the call.
    Error(String),
}

/// Everything requests must share to run in one engine call.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// Seed of the call (a seeded request runs only with its own sequences: `group`).
    pub seed: Option<u64>,
    /// Stop token ids (the model's EOS unless ignored, plus the request's).
    pub stop_ids: Vec<u32>,
    /// Adapter name.
    pub adapter: Option<String>,
    /// The HTTP request a seeded job belongs to (seeded streams depend on the batch index).
    pub group: Option<u64>,
}

/// A client pause (`/pause_generation`'s mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientPause {
    /// Requests aborted.
    Abort,
    /// Started requests retracted to waiting (recomputed after continue).
    Retract,
    /// Started requests kept in place.
    InPlace,
}

/// One sequence to generate.
pub struct Job {
    /// Server-wide id.
    pub id: u64,
    /// The client's request id (SGLang `rid`).
    pub rid: String,
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// Sampling.
    pub sampling: Sampling,
    /// Token budget.
    pub max_new: u32,
    /// Tokens per engine call when streaming.
    pub chunk: Option<u32>,
    out: UnboundedSender<Event>,
    generated: Vec<u32>,
    started: bool,
}

impl Job {
    /// A job whose events go to the returned receiver.
    pub fn new(
        rid: String,
        prompt: Vec<u32>,
        sampling: Sampling,
        max_new: u32,
        chunk: Option<u32>,
    ) -> (Job, UnboundedReceiver<Event>) {
        let (out, rx) = unbounded_channel();
        let job = Job {
            id: 0,
            rid,
            prompt,
            sampling,
            max_new,
            chunk,
            out,
            generated: Vec::new(),
            started: false,
        };
        (job, rx)
    }

    fn per_call(&self) -> u32 {
        let left = self.max_new.saturating_sub(self.generated.len() as u32);
        self.chunk.map_or(left, |c| c.clamp(1, left.max(1)))
    }

    /// Sends the final event (a dropped receiver is a client gone: nothing to tell).
    pub fn finish(&self, finish: Finish, version: u64) {
        let _ = self.out.send(Event::Done(finish, version));
    }

    fn fail(&self, message: &str) {
        let _ = self.out.send(Event::Error(message.to_owned()));
    }
}

/// A job inside the running engine call.
pub struct Running {
    /// Server-wide id.
    pub id: u64,
    /// Client request id.
    pub rid: String,
    /// Set by `/abort_request`: reported as aborted when the call returns.
    pub abort: Option<String>,
}

/// The server's state; one mutex, one condvar.
pub struct Sched {
    /// Jobs waiting for the engine (started streaming jobs included).
    pub queue: VecDeque<Job>,
    /// Jobs in the engine call now.
    pub running: Vec<Running>,
    /// An engine `generate` call is in progress.
    pub in_engine: bool,
    /// The client's pause, if any.
    pub pause: Option<ClientPause>,
    /// A control operation holds the engine (no dispatch meanwhile).
    pub control: bool,
    /// Mirror of the engine's lifecycle (the same machine the engine enforces).
    pub machine: EngineMachine,
    /// SGLang tags released (`weights`, `kv_cache`, `cuda_graph`).
    pub released: BTreeSet<String>,
    /// The `weight_version` label reported.
    pub label: String,
    /// Loaded adapters: name -> directory.
    pub adapters: BTreeMap<String, String>,
    /// The directory the served weights were loaded from (the model, then each
    /// `/update_weights_from_disk`), and its weights digest once computed.
    pub weights_dir: (String, Option<String>),
    /// `/begin_weight_update` opened a session.
    pub update_session: bool,
    /// Stop taking work.
    pub shutdown: bool,
    next_id: u64,
    /// The last call's jobs plus those queued while it ran (the concurrency the batcher
    /// waits for).
    last_batch: usize,
    /// How long the last engine call took.
    last_call: Duration,
}

impl Sched {
    fn can_dispatch(&self) -> bool {
        self.pause.is_none() && !self.control && self.machine.can_generate()
    }

    /// Requests SGLang would count as running or waiting right now (what makes
    /// `flush_cache` and `release_memory_occupation` refuse): while paused in `retract` or
    /// `abort` mode none, in `in_place` mode the started ones.
    pub fn busy(&self) -> usize {
        match self.pause {
            None => self.queue.len() + self.running.len(),
            Some(ClientPause::InPlace) => self.queue.iter().filter(|j| j.started).count(),
            Some(_) => 0,
        }
    }

    /// (running, waiting) as `/v1/loads` reports them: started requests between chunks run,
    /// unless retracted by a pause in `retract` mode.
    pub fn loads(&self) -> (usize, usize) {
        let started = match self.pause {
            Some(ClientPause::Retract) => 0,
            _ => self.queue.iter().filter(|j| j.started).count(),
        };
        (self.running.len() + started, self.queue.len() - started)
    }

    /// Aborts every queued job (and marks the running ones) matching `rid` (all if `None`);
    /// returns how many.
    pub fn abort(&mut self, rid: Option<&str>, message: &str) -> usize {
        let version = self.machine.version();
        let hit = |r: &str| rid.is_none_or(|x| x == r);
        let mut n = 0;
        for r in self.running.iter_mut().filter(|r| hit(&r.rid)) {
            r.abort = Some(message.to_owned());
            n += 1;
        }
        let (gone, keep): (Vec<Job>, Vec<Job>) = self.queue.drain(..).partition(|j| hit(&j.rid));
        self.queue = keep.into();
        for j in &gone {
            j.finish(Finish::Abort(message.to_owned()), version);
        }
        n + gone.len()
    }

    fn take_batch(&mut self, max_take: usize) -> Vec<Job> {
        self.queue.retain(|j| !j.out.is_closed());
        let Some(first) = self.queue.pop_front() else {
            return Vec::new();
        };
        let budget = first.per_call();
        let mut batch = vec![first];
        let mut rest = VecDeque::with_capacity(self.queue.len());
        for j in self.queue.drain(..) {
            if batch.len() < max_take && j.sampling == batch[0].sampling && j.per_call() == budget {
                batch.push(j);
            } else {
                rest.push_back(j);
            }
        }
        self.queue = rest;
        batch
    }
}

/// The engine and the shared state.
pub struct Server {
    /// The engine (its methods take `&self` and synchronise internally).
    pub engine: EngineBox,
    state: Mutex<Sched>,
    /// Signalled on every state change.
    pub cv: Condvar,
    /// Most jobs one engine call takes.
    pub max_take: usize,
    /// Longest wait for the previous call's clients to come back (see [`Server::gather`]).
    pub batch_wait: Duration,
}

impl Server {
    /// A server over `engine`, serving weights of `version` labelled `label`, loaded from
    /// `weights_dir`.
    pub fn new(
        engine: EngineBox,
        version: u64,
        label: String,
        weights_dir: String,
        max_take: usize,
        batch_wait: Duration,
    ) -> Arc<Server> {
        Arc::new(Server {
            engine,
            state: Mutex::new(Sched {
                queue: VecDeque::new(),
                running: Vec::new(),
                in_engine: false,
                pause: None,
                control: false,
                machine: EngineMachine::new(version),
                released: BTreeSet::new(),
                label,
                adapters: BTreeMap::new(),
                weights_dir: (weights_dir, None),
                update_session: false,
                shutdown: false,
                next_id: 1,
                last_batch: 1,
                last_call: Duration::ZERO,
            }),
            cv: Condvar::new(),
            max_take: max_take.max(1),
            batch_wait,
        })
    }

    /// The state, locked.
    pub fn lock(&self) -> MutexGuard<'_, Sched> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits on the condvar.
    pub fn wait<'a>(&self, g: MutexGuard<'a, Sched>) -> MutexGuard<'a, Sched> {
        self.cv.wait(g).unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues jobs (a job with no token budget finishes at once).
    pub fn submit(&self, jobs: Vec<Job>) {
        let mut g = self.lock();
        let version = g.machine.version();
        for mut job in jobs {
            job.id = g.next_id;
            g.next_id += 1;
            if job.max_new == 0 {
                job.finish(Finish::Length, version);
            } else if g.shutdown {
                job.fail("the server is shutting down");
            } else {
                g.queue.push_back(job);
            }
        }
        drop(g);
        self.cv.notify_all();
    }

    /// Stops the engine thread; queued jobs fail.
    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.cv.notify_all();
    }

    /// Closed-loop clients answered by the previous call send their next requests a moment
    /// after it returns; dispatching the first arrival alone would split them into a batch
    /// of one and a batch of the rest, alternating. So while fewer jobs are queued than the
    /// previous call took plus those that queued while it ran, wait for them (dispatching as
    /// soon as they are there) up to `batch_wait` or an eighth of the previous call's time,
    /// whichever is longer: waiting costs at most that share of a call, a split batch a
    /// whole call. A lone client never waits, and when clients leave the target drops after
    /// one call.
    fn gather<'a>(&self, mut g: MutexGuard<'a, Sched>) -> MutexGuard<'a, Sched> {
        let target = g.last_batch.min(self.max_take);
        let deadline = Instant::now() + self.batch_wait.max(g.last_call / 8);
        while g.queue.len() < target && !g.shutdown && g.can_dispatch() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        g
    }

    /// The engine thread: dispatches batches until shutdown.
    pub fn run_batcher(&self) {
        let mut g = self.lock();
        loop {
            while !g.shutdown && (!g.can_dispatch() || g.queue.is_empty()) {
                g = self.wait(g);
            }
            if g.shutdown {
                for j in g.queue.drain(..) {
                    j.fail("the server is shutting down");
                }
                return;
            }
            g = self.gather(g);
            if g.shutdown || !g.can_dispatch() {
                continue;
            }
            let batch = g.take_batch(self.max_take);
            if batch.is_empty() {
                continue;
            }
            g.in_engine = true;
            g.running = batch
                .iter()
                .map(|j| Running {
                    id: j.id,
                    rid: j.rid.clone(),
                    abort: None,
                })
                .collect();
            let queued = g.queue.len();
            drop(g);
            tracing::debug!(jobs = batch.len(), queued, "engine call");
            let t = Instant::now();
            let result = self.engine.generate(request(&batch)).into_result();
            g = self.lock();
            g.last_call = t.elapsed();
            g.in_engine = false;
            // The clients just answered plus those that queued meanwhile: what the next
            // call should gather.
            g.last_batch = batch.len() + g.queue.len();
            let aborts: Vec<Option<String>> = g.running.drain(..).map(|r| r.abort).collect();
            let mut back = Vec::new();
            match result {
                Ok(resp) => {
                    let v = resp.weight_version;
                    for ((job, c), abort) in batch.into_iter().zip(resp.completions).zip(aborts) {
                        back.extend(settle(&g, job, c, abort, v));
                    }
                }
                // A pause got in between the dispatch and the engine: put the jobs back.
                Err(e) if e.code == ErrorCode::InvalidState && !g.can_dispatch() => {
                    back = batch;
                }
                Err(e) => {
                    for j in &batch {
                        j.fail(&e.to_string());
                    }
                }
            }
            let version = g.machine.version();
            for job in back.into_iter().rev() {
                if g.pause == Some(ClientPause::Abort) {
                    job.finish(Finish::Abort(paused_abort()), version);
                } else {
                    g.queue.push_front(job);
                }
            }
            self.cv.notify_all();
        }
    }
}

fn paused_abort() -> String {
    "aborted by /pause_generation (mode abort)".to_owned()
}

fn request(batch: &[Job]) -> GenerateRequest {
    let s = &batch[0].sampling;
    GenerateRequest {
        prompts: batch
            .iter()
            .map(|j| {
                j.prompt
                    .iter()
                    .chain(&j.generated)
                    .copied()
                    .collect::<RVec<u32>>()
            })
            .collect(),
        sampling: SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            max_tokens: batch[0].per_call(),
            stop_token_ids: s.stop_ids.iter().copied().collect(),
            seed: s.seed.into(),
            logprobs: true,
            return_hidden_states: false,
        },
        adapter: match &s.adapter {
            Some(a) => ROption::RSome(RString::from(a.as_str())),
            None => ROption::RNone,
        },
    }
}

/// Delivers one completion; returns the job when it must go back to the queue.
fn settle(
    g: &Sched,
    mut job: Job,
    c: Completion,
    abort: Option<String>,
    version: u64,
) -> Option<Job> {
    let asked = job.per_call() as usize;
    job.started = true;
    let n = c.tokens.len();
    if n > 0 {
        job.generated.extend(c.tokens.iter().copied());
        let _ = job
            .out
            .send(Event::Tokens(c.tokens.to_vec(), c.logprobs.to_vec()));
    }
    let finish = match (abort, c.finish_reason) {
        (Some(msg), _) => Some(Finish::Abort(msg)),
        (None, FinishReason::Aborted) => Some(Finish::Abort(paused_abort())),
        (None, FinishReason::Stop) => Some(Finish::Stop(c.tokens.last().copied().unwrap_or(0))),
        (None, FinishReason::Length) => {
            let done = job.generated.len() >= job.max_new as usize || n < asked;
            done.then_some(Finish::Length)
        }
    };
    match finish {
        Some(f) => {
            job.finish(f, version);
            None
        }
        None if job.out.is_closed() || g.shutdown => None,
        None => Some(job),
    }
}
