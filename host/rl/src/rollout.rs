//! One rollout: problems from the environment, `group_size` samples of each spread over the
//! engines (whole groups per engine, engines in parallel), decoded and scored in one batch;
//! an engine that failed is asked again for its own groups only ([`Pending`]). Samples whose
//! reward failed (or did not apply) are counted in the rollout's tally and left out of its
//! samples: nothing trains on them.

use super::prompt::PromptCodec;
use crate::algorithm::grpo::Sample;
use crate::env::{Env, Problem, ScoreTally, ToScore};
use crate::error::RlError;
use crate::turns::{self, Calls, Place, Trajectory};
use tandem_plugin_api::{
    Completion, FinishReason, GenerateRequest, ROption, RString, RVec, RewardStatus, SamplingParams,
};
use tandem_runtime::launch::RemoteEngine;

/// Rollout settings.
#[derive(Debug, Clone)]
pub struct RolloutSpec {
    /// Index of the first problem (the data position).
    pub first_problem: u64,
    /// Problems (groups).
    pub prompts: u32,
    /// Samples per problem.
    pub group_size: u32,
    /// Max new tokens.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// Seed of this rollout's sampling.
    pub seed: u64,
    /// Adapter the requests name (lora bridge).
    pub adapter: Option<String>,
    /// The weight version the engines serve while they generate it.
    pub version: u64,
}

/// Samples with rewards, plus the number of exactly right answers and what scoring counted.
pub struct Rollout {
    /// Every sample whose reward is `ok`, grouped by `group`.
    pub samples: Vec<Sample>,
    /// Samples with the highest reward the environment declares.
    pub exact: usize,
    /// Scoring's tally: failed and not-applicable samples, reasons, time, components.
    pub tally: ScoreTally,
    /// `(item id, reason)` of each failed sample.
    pub failures: Vec<(String, String)>,
    /// The ids of the rollout's problems, in order.
    pub items: Vec<String>,
    /// With tools: the tool calls of its trajectories.
    pub calls: Option<Calls>,
    /// Its trajectories by state.
    pub ledger: Ledger,
}

/// Called with an engine rank's whole share the moment it is in: `(rank, prompts,
/// completions)` (no completions for a multi-turn share).
pub type ShareDone<'a> = dyn Fn(usize, &[RVec<u32>], &[Completion]) + Sync + 'a;

/// A rollout under way: its problems, their prompts, which engine generates which groups,
/// and what each engine has returned so far. An engine whose worker died is asked again
/// (by its replacement) for its own groups only; the others keep their completions.
pub struct Pending {
    problems: Vec<Problem>,
    prompts: Vec<Vec<u32>>,
    /// Engine `e`'s groups: e, e + E, ... (whole groups per engine).
    assignment: Vec<Vec<usize>>,
    /// Each engine's trajectories (single-turn: one completion each), once it returned them.
    shares: Vec<Option<Vec<Trajectory>>>,
    /// The id of each share's first trajectory in its latest attempt.
    first_id: Vec<u64>,
    /// What happened to the trajectories started so far.
    ledger: Ledger,
}

/// A rollout's trajectories by state: every one started is, at the end, completed (scored),
/// failed (its reward failed) or dropped (lost with its engine and generated again under a
/// new id, or its reward did not apply); none is trained twice, since an id is never reused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Trajectories started (each attempt of a share starts its trajectories anew).
    pub started: u64,
    /// Scored with a reward.
    pub completed: u64,
    /// Their reward failed.
    pub failed: u64,
    /// Lost with their engine (retried under new ids), or their reward did not apply.
    pub dropped: u64,
}

impl Ledger {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Ledger) {
        self.started += other.started;
        self.completed += other.completed;
        self.failed += other.failed;
        self.dropped += other.dropped;
    }
}

impl Pending {
    /// The rollout of `spec` over `engines` engines: problems drawn and prompts encoded,
    /// nothing generated yet.
    pub fn new(
        spec: &RolloutSpec,
        engines: usize,
        env: &Env,
        codec: &PromptCodec,
    ) -> Result<Pending, RlError> {
        let problems: Vec<Problem> = (0..u64::from(spec.prompts))
            .map(|i| env.problem(spec.first_problem + i))
            .collect::<Result<_, _>>()?;
        let prompts = problems
            .iter()
            .map(|p| codec.prompt_of(p))
            .collect::<Result<Vec<_>, _>>()?;
        let n = engines.max(1);
        let assignment: Vec<Vec<usize>> = (0..n)
            .map(|e| (e..problems.len()).step_by(n).collect())
            .collect();
        let shares = assignment
            .iter()
            .map(|g| g.is_empty().then(Vec::new))
            .collect();
        Ok(Pending {
            problems,
            prompts,
            first_id: vec![0; assignment.len()],
            assignment,
            shares,
            ledger: Ledger::default(),
        })
    }

    /// Engine ranks whose completions are still missing.
    pub fn missing(&self) -> Vec<usize> {
        (0..self.shares.len())
            .filter(|&e| self.shares[e].is_none())
            .collect()
    }

    /// Generates the missing shares, every engine in parallel; `done(rank, prompts,
    /// completions)` is called with an engine's whole share the moment it returned it (while
    /// the others may still generate).
    /// Every engine that answered keeps its completions; the first failure (by rank) is
    /// returned with its rank.
    pub fn generate(
        &mut self,
        spec: &RolloutSpec,
        engines: &[RemoteEngine],
        codec: &PromptCodec,
        done: &ShareDone<'_>,
    ) -> Result<(), (usize, RlError)> {
        let missing = self.missing();
        for &e in &missing {
            self.first_id[e] = self.ledger.started;
            self.ledger.started += (self.assignment[e].len() * spec.group_size as usize) as u64;
        }
        let replies = std::thread::scope(|s| {
            let handles: Vec<_> = missing
                .iter()
                .map(|&e| {
                    let request =
                        request(spec, e as u64, &self.assignment[e], &self.prompts, codec);
                    let want = self.assignment[e].len() * spec.group_size as usize;
                    let engine = &engines[e];
                    s.spawn(move || {
                        let prompts = request.prompts.clone();
                        if let Some(tools) = codec.tools() {
                            let out = tools.run(request, codec, &mut |r| {
                                engine.generate(r).map_err(RlError::from)
                            })?;
                            // The share is in (no drafter learns from multi-turn shares).
                            if out.len() == want {
                                done(e, &prompts, &[]);
                            }
                            return Ok(out);
                        }
                        let reply = engine.generate(request).map_err(RlError::from)?;
                        if reply.completions.len() == want {
                            done(e, &prompts, &reply.completions);
                        }
                        Ok(reply
                            .completions
                            .into_iter()
                            .map(Trajectory::single)
                            .collect())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(RlError::failed("a rollout thread panicked")))
                })
                .collect::<Vec<_>>()
        });
        let mut first = None;
        for (e, reply) in missing.into_iter().zip(replies) {
            let want = self.assignment[e].len() * spec.group_size as usize;
            match reply {
                Ok(r) if r.len() == want => {
                    self.shares[e] = Some(r);
                    continue;
                }
                Ok(r) => {
                    let e2 = RlError::failed(format!(
                        "engine rank {e} returned {} completions for {want} prompts",
                        r.len()
                    ));
                    first.get_or_insert((e, e2));
                }
                Err(err) => {
                    first.get_or_insert((e, err));
                }
            }
            // The share's trajectories are lost; its next attempt starts them under new ids.
            self.ledger.dropped += want as u64;
        }
        first.map_or(Ok(()), Err)
    }

    /// Decodes every engine's completions (all must be there) and scores them in one batch.
    pub fn finish(
        self,
        spec: &RolloutSpec,
        env: &Env,
        codec: &PromptCodec,
    ) -> Result<Rollout, RlError> {
        let mut done: Vec<(usize, u64, &Trajectory)> =
            Vec::with_capacity(self.problems.len() * spec.group_size as usize);
        for (e, (share, groups)) in self.shares.iter().zip(&self.assignment).enumerate() {
            let Some(trajectories) = share else {
                return Err(RlError::failed(format!(
                    "engine rank {e} has not generated its part of the rollout"
                )));
            };
            for (k, t) in trajectories.iter().enumerate() {
                let id = self.first_id[e] + k as u64;
                done.push((groups[k / spec.group_size as usize], id, t));
            }
        }
        let empty = Completion::new(Vec::new(), Vec::new(), FinishReason::Aborted);
        let batch = done
            .iter()
            .map(|&(g, _, t)| {
                // A trajectory is scored on its last turn: the answer it ends with.
                let c = t.last().unwrap_or(&empty);
                Ok(ToScore {
                    problem: &self.problems[g],
                    text: codec.decode(&c.tokens)?,
                    token_ids: c.tokens.to_vec(),
                    finished: c.finish_reason == FinishReason::Stop,
                })
            })
            .collect::<Result<Vec<_>, RlError>>()?;
        let scored = env.score(&batch);
        let top = env.info().reward_max;
        let mut samples = Vec::with_capacity(done.len());
        let mut failures = Vec::new();
        let mut exact = 0;
        let mut calls = Calls::default();
        let mut ledger = self.ledger;
        let multi = codec.tools().is_some();
        for ((g, id, t), r) in done.into_iter().zip(scored.rewards) {
            calls.add(&t.calls);
            match r.status {
                RewardStatus::Ok => ledger.completed += 1,
                RewardStatus::Failed => {
                    ledger.failed += 1;
                    failures.push((self.problems[g].id().to_owned(), r.reason.to_string()));
                    continue;
                }
                RewardStatus::NotApplicable => {
                    ledger.dropped += 1;
                    continue;
                }
            }
            if r.value >= top {
                exact += 1;
            }
            let at = Place {
                group: g,
                prompt: &self.prompts[g],
                id,
                multi,
            };
            samples.extend(turns::samples(t, at, r.value, spec.version));
        }
        samples.sort_by_key(|s| s.group);
        Ok(Rollout {
            samples,
            exact,
            tally: scored.tally,
            failures,
            items: self.problems.iter().map(|p| p.id().to_owned()).collect(),
            calls: multi.then_some(calls),
            ledger,
        })
    }
}

fn request(
    spec: &RolloutSpec,
    engine: u64,
    groups: &[usize],
    prompts: &[Vec<u32>],
    codec: &PromptCodec,
) -> GenerateRequest {
    let mut batch = Vec::with_capacity(groups.len() * spec.group_size as usize);
    for &g in groups {
        for _ in 0..spec.group_size {
            batch.push(RVec::from(prompts[g].clone()));
        }
    }
    GenerateRequest {
        prompts: RVec::from(batch),
        sampling: SamplingParams {
            temperature: spec.temperature,
            top_p: 1.0,
            top_k: 0,
            max_tokens: spec.max_tokens,
            stop_token_ids: RVec::from(codec.stop_ids().to_vec()),
            seed: ROption::RSome(spec.seed ^ engine.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            logprobs: true,
            return_hidden_states: false,
        },
        adapter: match &spec.adapter {
            Some(a) => ROption::RSome(RString::from(a.as_str())),
            None => ROption::RNone,
        },
    }
}
