//! Held-out evaluation: greedy accuracy on the fixed held-out set of a task
//! ([`crate::task::split`]), shared by the run's `[eval]` phase and `tandem eval`.
//!
//! Both build the same [`EvalSet`] (problems from `(task, seed, K)`, prompts through the same
//! [`PromptCodec`]) and ask the same requests: with `R` engine ranks, rank `r` gets problems
//! `r, r + R, ...` in one request (as rollouts spread groups), temperature 0, the codec's stop
//! ids, seed 0. The native engine batches a request in chunks of `max_batch`, so the same
//! ranks and engine options give the same batches and therefore the same tokens: `tandem
//! eval --job` on a run's checkpoint reproduces that step's `eval_accuracy`. A problem is
//! right when the task's reward for the decoded completion is 1.

use crate::error::RlError;
use crate::prompt::PromptCodec;
use crate::task::{HeldOut, Problem, Task};
use serde::Serialize;
use tandem_plugin_api::{
    GenerateRequest, GenerateResponse, ROption, RString, RVec, SamplingParams,
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
    /// The problem's text (before any chat template).
    pub prompt: String,
    /// The expected answer.
    pub answer: String,
    /// The decoded completion.
    pub completion: String,
    /// Whether the task's reward for it is 1.
    pub right: bool,
}

/// What one evaluation found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalResult {
    /// Problems answered right.
    pub correct: u32,
    /// Problems asked.
    pub problems: u32,
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
    /// The prompts of `held_out` encoded by `codec`, answered in at most `max_tokens`.
    pub fn new(
        held_out: &HeldOut,
        codec: &PromptCodec,
        max_tokens: u32,
    ) -> Result<EvalSet, RlError> {
        let problems = held_out.problems().to_vec();
        let prompts = problems
            .iter()
            .map(|p| codec.prompt(&p.prompt))
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
        task: &dyn Task,
        codec: &PromptCodec,
        replies: &[Option<GenerateResponse>],
    ) -> Result<EvalResult, RlError> {
        let answers = self.answers(task, codec, replies)?;
        Ok(EvalResult {
            correct: answers.iter().filter(|a| a.right).count() as u32,
            problems: self.problems.len() as u32,
        })
    }

    /// Every problem's decoded answer and whether it is right, in problem order.
    pub fn answers(
        &self,
        task: &dyn Task,
        codec: &PromptCodec,
        replies: &[Option<GenerateResponse>],
    ) -> Result<Vec<Answer>, RlError> {
        let ranks = replies.len();
        let mut answers: Vec<Option<Answer>> = vec![None; self.problems.len()];
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
                let completion = codec.decode(&c.tokens)?;
                let right = task.reward(&self.problems[i], &completion) >= 1.0;
                answers[i] = Some(Answer {
                    prompt: self.problems[i].prompt.clone(),
                    answer: self.problems[i].answer.clone(),
                    completion,
                    right,
                });
            }
        }
        answers
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                a.ok_or_else(|| RlError::failed(format!("evaluation: problem {i} got no answer")))
            })
            .collect()
    }
}
