//! One rollout: problems from the task, `group_size` samples of each spread over the
//! engines (whole groups per engine, engines in parallel), decoded and rewarded.

use super::grpo::Sample;
use super::prompt::PromptCodec;
use crate::error::RlError;
use crate::task::{Problem, Task};
use tandem_plugin_api::{GenerateRequest, ROption, RString, RVec, SamplingParams};
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
}

/// Samples with rewards, plus the number of exactly right answers.
pub struct Rollout {
    /// Every sample, grouped by `group`.
    pub samples: Vec<Sample>,
    /// Samples whose reward is 1.
    pub exact: usize,
}

/// Generates and rewards one rollout.
pub fn run(
    spec: &RolloutSpec,
    engines: &[RemoteEngine],
    task: &dyn Task,
    codec: &PromptCodec,
) -> Result<Rollout, RlError> {
    let problems: Vec<Problem> = (0..u64::from(spec.prompts))
        .map(|i| task.problem(spec.first_problem + i))
        .collect();
    let prompts = problems
        .iter()
        .map(|p| codec.prompt(&p.prompt))
        .collect::<Result<Vec<_>, _>>()?;
    // Whole groups per engine: engine e gets groups e, e + E, ...
    let n = engines.len().max(1);
    let assignment: Vec<Vec<usize>> = (0..n)
        .map(|e| (e..problems.len()).step_by(n).collect())
        .collect();
    let replies = std::thread::scope(|s| {
        let handles: Vec<_> = engines
            .iter()
            .zip(&assignment)
            .enumerate()
            .map(|(e, (engine, groups))| {
                let request = request(spec, e as u64, groups, &prompts, codec);
                s.spawn(move || {
                    if groups.is_empty() {
                        return Ok(None);
                    }
                    engine.generate(request).map(Some).map_err(RlError::from)
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
    let mut samples = Vec::with_capacity(problems.len() * spec.group_size as usize);
    let mut exact = 0;
    for (reply, groups) in replies.into_iter().zip(&assignment) {
        let Some(response) = reply? else { continue };
        let want = groups.len() * spec.group_size as usize;
        if response.completions.len() != want {
            return Err(RlError::failed(format!(
                "an engine returned {} completions for {want} prompts",
                response.completions.len()
            )));
        }
        for (k, c) in response.completions.iter().enumerate() {
            let g = groups[k / spec.group_size as usize];
            let text = codec.decode(&c.tokens)?;
            let reward = task.reward(&problems[g], &text);
            if reward >= 1.0 {
                exact += 1;
            }
            samples.push(Sample {
                group: g,
                prompt: prompts[g].clone(),
                completion: c.tokens.to_vec(),
                logprobs: c.logprobs.to_vec(),
                reward,
            });
        }
    }
    samples.sort_by_key(|s| s.group);
    Ok(Rollout { samples, exact })
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
