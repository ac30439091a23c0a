//! Held-out evaluation: greedy accuracy on the environment's held-out split, shared by the
//! run's `[eval]` phase and `tandem eval`.
//!
//! Both build the same [`EvalSet`] (items `0..K` of split `held_out` of the environment built
//! with the run's seed, prompts through the same
//! [`PromptCodec`]) and ask the same requests: with `R` engine ranks, rank `r` gets problems
//! `r, r + R, ...` in one request (as rollouts spread groups), temperature 0, the codec's stop
//! ids, seed 0. The native engine batches a request in chunks of `max_batch`, so the same
//! ranks and engine options give the same batches and therefore the same tokens: `tandem
//! eval --job` on a run's checkpoint reproduces that step's `eval_accuracy`. A problem is
//! right when the environment's reward for the decoded completion is its highest (a failed
//! reward is wrong, and counted as failed).

use crate::env::{Env, Problem, ToScore};
use crate::error::RlError;
use crate::prompt::PromptCodec;
use serde::Serialize;
use std::collections::BTreeMap;
use tandem_plugin_api::{
    FinishReason, GenerateRequest, GenerateResponse, ROption, RString, RVec, RewardStatus,
    SamplingParams,
};

/// The held-out problems with their prompt ids and how long answers may be.
pub struct EvalSet {
    problems: Vec<Problem>,
    prompts: Vec<Vec<u32>>,
    stop: Vec<u32>,
    max_tokens: u32,
}

/// One held-out problem's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// The item's id.
    pub id: String,
    /// Its data source (may be empty).
    pub source: String,
    /// The problem's text (before any chat template; empty for a chat item).
    pub prompt: String,
    /// The expected answer.
    pub answer: String,
    /// The decoded completion.
    pub completion: String,
    /// Whether the environment's reward for it is the highest.
    pub right: bool,
    /// Why its reward failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// What one evaluation found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalResult {
    /// Problems answered right.
    pub correct: u32,
    /// Problems asked.
    pub problems: u32,
    /// Problems whose reward failed (counted as wrong).
    pub failed: u32,
    /// `(right, asked)` per data source (items with one).
    pub by_source: BTreeMap<String, (u32, u32)>,
}

impl EvalResult {
    /// Fraction of problems answered right (0 for an empty set).
    pub fn accuracy(&self) -> f64 {
        if self.problems == 0 {
            return 0.0;
        }
        f64::from(self.correct) / f64::from(self.problems)
    }
}

impl EvalSet {
    /// The prompts of `problems` (the held-out items) encoded by `codec`, answered in at
    /// most `max_tokens`.
    pub fn new(
        problems: Vec<Problem>,
        codec: &PromptCodec,
        max_tokens: u32,
    ) -> Result<EvalSet, RlError> {
        let prompts = problems
            .iter()
            .map(|p| codec.prompt_of(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EvalSet {
            problems,
            prompts,
            stop: codec.stop_ids().to_vec(),
            max_tokens,
        })
    }

    /// The problems.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// The longest prompt in tokens.
    pub fn longest_prompt(&self) -> usize {
        self.prompts.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The problems rank `rank` of `ranks` answers.
    fn share(&self, rank: usize, ranks: usize) -> Vec<usize> {
        (rank..self.problems.len()).step_by(ranks.max(1)).collect()
    }

    /// The greedy request of rank `rank` of `ranks` (`None` when it has no problem), under
    /// `adapter` when the run names one.
    pub fn request(
        &self,
        rank: usize,
        ranks: usize,
        adapter: Option<&str>,
    ) -> Option<GenerateRequest> {
        let share = self.share(rank, ranks);
        if share.is_empty() {
            return None;
        }
        let prompts: Vec<RVec<u32>> = share
            .iter()
            .map(|&i| RVec::from(self.prompts[i].clone()))
            .collect();
        Some(GenerateRequest {
            prompts: RVec::from(prompts),
            sampling: SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                max_tokens: self.max_tokens,
                stop_token_ids: RVec::from(self.stop.clone()),
                seed: ROption::RSome(0),
                logprobs: false,
                return_hidden_states: false,
            },
            adapter: match adapter {
                Some(a) => ROption::RSome(RString::from(a)),
                None => ROption::RNone,
            },
        })
    }

    /// Scores the replies of every rank (in rank order, `None` where [`EvalSet::request`]
    /// was `None`).
    pub fn score(
        &self,
        env: &Env,
        codec: &PromptCodec,
        replies: &[Option<GenerateResponse>],
    ) -> Result<EvalResult, RlError> {
        let answers = self.answers(env, codec, replies)?;
        Ok(EvalResult::of(&answers))
    }

    /// Every problem's decoded answer and whether it is right, in problem order (scored in
    /// one batch).
    pub fn answers(
        &self,
        env: &Env,
        codec: &PromptCodec,
        replies: &[Option<GenerateResponse>],
    ) -> Result<Vec<Answer>, RlError> {
        let ranks = replies.len();
        let mut done: Vec<Option<ToScore<'_>>> = vec![None; self.problems.len()];
        for (rank, reply) in replies.iter().enumerate() {
            let share = self.share(rank, ranks);
            let got = reply.as_ref().map_or(0, |r| r.completions.len());
            if got != share.len() {
                return Err(RlError::failed(format!(
                    "evaluation: engine rank {rank} returned {got} completions for {} prompts",
                    share.len()
                )));
            }
            let Some(reply) = reply else { continue };
            for (&i, c) in share.iter().zip(reply.completions.iter()) {
                done[i] = Some(ToScore {
                    problem: &self.problems[i],
                    text: codec.decode(&c.tokens)?,
                    token_ids: c.tokens.to_vec(),
                    finished: c.finish_reason == FinishReason::Stop,
                });
            }
        }
        let batch = done
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                a.ok_or_else(|| RlError::failed(format!("evaluation: problem {i} got no answer")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let top = env.info().reward_max;
        let scored = env.score(&batch);
        Ok(batch
            .into_iter()
            .zip(scored.rewards)
            .map(|(s, r)| {
                let ok = r.status == RewardStatus::Ok;
                Answer {
                    id: s.problem.id().to_owned(),
                    source: s.problem.item.source.to_string(),
                    prompt: s.problem.prompt().to_owned(),
                    answer: s.problem.answer().to_owned(),
                    completion: s.text,
                    right: ok && r.value >= top,
                    failed: (r.status == RewardStatus::Failed).then(|| r.reason.to_string()),
                }
            })
            .collect())
    }
}

impl EvalResult {
    /// The figures of `answers`.
    pub fn of(answers: &[Answer]) -> EvalResult {
        let mut by_source: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        for a in answers.iter().filter(|a| !a.source.is_empty()) {
            let e = by_source.entry(a.source.clone()).or_default();
            e.0 += u32::from(a.right);
            e.1 += 1;
        }
        EvalResult {
            correct: answers.iter().filter(|a| a.right).count() as u32,
            problems: answers.len() as u32,
            failed: answers.iter().filter(|a| a.failed.is_some()).count() as u32,
            by_source,
        }
    }
}
