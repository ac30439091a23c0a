//! Multi-turn rollouts with tools (`[environment] tools`): the model writes a tool call in its
//! own format, the tool answers, the answer goes back as the template's tool message, and the
//! model goes on, for at most `max_turns` assistant turns.
//!
//! **Token in, token out.** A trajectory is the exact sequence of ids the engine saw: the
//! prompt, then each turn's tokens as the engine produced them (trained, with the engine's
//! logprobs), then the tokens between turns (the template's close of the assistant turn after
//! the engine's stop token, the tool messages, the next assistant header: never trained).
//! Nothing the engine produced is decoded and encoded again: only the text the template adds
//! is rendered (on its own, [`PromptCodec::between_turns`]) and tokenized, and the context of
//! the next turn is the previous context with those ids appended. That is sound only for a
//! template that renders append-only; [`PromptCodec::for_env`] checks that once, with a tool
//! turn in the probe, and refuses a template that is not in one line.
//!
//! **Trained per turn.** Each assistant turn becomes one [`Sample`](crate::algorithm::grpo::Sample)
//! whose prompt is everything before it (the exact ids) and whose completion is the turn's
//! tokens, all carrying the trajectory's reward. With causal attention each turn's logprobs
//! depend on its prefix only, so the token-mean loss over the turns is the masked loss of the
//! whole trajectory: the same tokens, the same contexts, every tool and template token masked.
//! Group statistics count each trajectory once ([`Sample::opens`](crate::algorithm::grpo::Sample::opens)).
//! The cost is the prefix's forward pass once per turn.
//!
//! Turns are batched: every trajectory still going generates its next turn in one request per
//! engine. A trajectory ends at a turn without a tool call, at a turn the engine did not stop
//! itself (length), after `max_turns` turns, or when its next turn could pass its token
//! budget (`max_trajectory_tokens`, the tokens after the prompt; default `max_turns ×
//! max_tokens`), so a trajectory never holds more than its budget.

#[cfg(test)]
mod tests;

use crate::algorithm::grpo::{Sample, Turn};
use crate::config::EnvironmentSection;
use crate::error::RlError;
use crate::prompt::PromptCodec;
use serde_json::json;
use tandem_model::chat::Message;
use tandem_model::tools::{BUILTIN_TOOLS, ParsedCall, ToolFamily, run_builtin};
use tandem_plugin_api::{Completion, FinishReason, GenerateRequest, GenerateResponse, RVec};

/// One multi-turn trajectory: the engine's turns and the ids between them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trajectory {
    /// The engine's completion of each assistant turn, as it returned it.
    pub turns: Vec<Completion>,
    /// The ids after turn `k` (tool answers and the template's text; never trained): one
    /// fewer than `turns`.
    pub between: Vec<Vec<u32>>,
    /// The tool calls of its turns.
    pub calls: Calls,
}

impl Trajectory {
    /// A single-turn trajectory.
    pub fn single(c: Completion) -> Trajectory {
        Trajectory {
            turns: vec![c],
            ..Trajectory::default()
        }
    }

    /// Its last turn (what is scored).
    pub fn last(&self) -> Option<&Completion> {
        self.turns.last()
    }

    /// Ids after the prompt: every turn's and every between's.
    pub fn len(&self) -> usize {
        self.turns.iter().map(|c| c.tokens.len()).sum::<usize>()
            + self.between.iter().map(Vec::len).sum::<usize>()
    }

    /// Whether it holds no ids after its prompt.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids after the prompt with their mask: 1 for the engine's tokens, 0 for the rest.
    pub fn tokens_and_mask(&self) -> (Vec<u32>, Vec<u8>) {
        let mut ids = Vec::with_capacity(self.len());
        let mut mask = Vec::with_capacity(self.len());
        for (k, c) in self.turns.iter().enumerate() {
            ids.extend(c.tokens.iter());
            mask.extend(std::iter::repeat_n(1u8, c.tokens.len()));
            if let Some(b) = self.between.get(k) {
                ids.extend(b);
                mask.extend(std::iter::repeat_n(0u8, b.len()));
            }
        }
        (ids, mask)
    }
}

/// A turn's answer: the ids between it and the next turn (`None`: the trajectory ends), and
/// its calls.
type Answer = (Option<Vec<u32>>, Calls);

/// Tool calls counted over trajectories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    /// Calls the model attempted (well-formed or not).
    pub attempted: u64,
    /// Attempts that parsed as a call.
    pub well_formed: u64,
    /// Calls answered with a result (not an error).
    pub answered: u64,
    /// Calls answered with an error (malformed, unknown tool, the tool's own error).
    pub failed: u64,
}

impl Calls {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Calls) {
        self.attempted += other.attempted;
        self.well_formed += other.well_formed;
        self.answered += other.answered;
        self.failed += other.failed;
    }
}

/// How a run's rollouts use tools: the format, the tools offered and the limits.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    family: ToolFamily,
    tools: Vec<String>,
    max_turns: u32,
    budget: Option<u32>,
    prompt: Option<String>,
}

impl ToolUse {
    /// The tool use `section` asks for (`None` without tools) with the format `template`
    /// teaches unless `tool_format` names one.
    pub fn of(section: &EnvironmentSection, template: &str) -> Result<Option<ToolUse>, RlError> {
        if section.tools.is_empty() {
            return Ok(None);
        }
        if let Some(t) = section
            .tools
            .iter()
            .find(|t| !BUILTIN_TOOLS.contains(&t.as_str()))
        {
            return Err(
                RlError::usage(format!("[environment] tools: unknown tool `{t}`"))
                    .with_help(format!("the built-in tools: {}", BUILTIN_TOOLS.join(", "))),
            );
        }
        let family =
            ToolFamily::resolve(template, section.tool_format.as_deref()).map_err(|e| {
                RlError::usage(format!("[environment] tool_format: {e}")).with_help(
                    "name the format the model should write: tool_format = \"hermes\" (<tool_call> \
                 JSON) or \"llama3\"",
                )
            })?;
        Ok(Some(ToolUse {
            family,
            tools: section.tools.clone(),
            max_turns: section.max_turns.max(1),
            budget: section.max_trajectory_tokens,
            prompt: section.tool_prompt.clone(),
        }))
    }

    /// The call format.
    pub fn family(&self) -> ToolFamily {
        self.family
    }

    /// Assistant turns per trajectory at most.
    pub fn max_turns(&self) -> u32 {
        self.max_turns
    }

    /// The system text that shows the model its tools and how to call them: `tool_prompt`
    /// when the job gives one, else a short one with a call of each tool in the family's
    /// format.
    pub fn instructions(&self) -> String {
        if let Some(p) = &self.prompt {
            return p.clone();
        }
        let calls: Vec<String> = self
            .tools
            .iter()
            .map(|t| {
                let (what, args) = match t.as_str() {
                    "python" => (
                        "run Python (what it prints comes back)",
                        json!({"code": "print(2 ** 10)"}),
                    ),
                    _ => ("calculate", json!({"expression": "13 + 98"})),
                };
                format!("To {what}, write:\n{}\n", self.call_text(t, &args))
            })
            .collect();
        format!(
            "{}The result comes back in the next message. Then answer.",
            calls.concat()
        )
    }

    /// A call of `tool` with `args` as the family writes it (the name first, as the
    /// families' own examples have it).
    pub fn call_text(&self, tool: &str, args: &serde_json::Value) -> String {
        match self.family {
            ToolFamily::Hermes => format!(
                "<tool_call>\n{{\"name\": \"{tool}\", \"arguments\": {args}}}\n</tool_call>"
            ),
            ToolFamily::Llama3 => format!("{{\"name\": \"{tool}\", \"parameters\": {args}}}"),
        }
    }

    /// Runs `request`'s prompts as multi-turn trajectories: every trajectory still going
    /// generates its next turn in one `generate` call (the request's sampling, its seed
    /// varied per turn), each call is answered, and the answers' ids are appended.
    pub fn run(
        &self,
        request: GenerateRequest,
        codec: &PromptCodec,
        generate: &mut dyn FnMut(GenerateRequest) -> Result<GenerateResponse, RlError>,
    ) -> Result<Vec<Trajectory>, RlError> {
        let n = request.prompts.len();
        let mut contexts: Vec<Vec<u32>> = request.prompts.iter().map(|p| p.to_vec()).collect();
        let mut out = vec![Trajectory::default(); n];
        let mut active: Vec<usize> = (0..n).collect();
        let max_tokens = request.sampling.max_tokens as usize;
        let budget = self
            .budget
            .map_or(self.max_turns as usize * max_tokens, |b| b as usize);
        for turn in 0..self.max_turns {
            if active.is_empty() {
                break;
            }
            let mut r = request.clone();
            r.prompts = active
                .iter()
                .map(|&i| RVec::from(contexts[i].clone()))
                .collect();
            r.sampling.seed = r
                .sampling
                .seed
                .map(|s| s ^ u64::from(turn).wrapping_mul(0xD1B5_4A32_D192_ED03));
            let reply = generate(r)?;
            if reply.completions.len() != active.len() {
                return Err(RlError::failed(format!(
                    "turn {turn}: the engine returned {} completions for {} prompts",
                    reply.completions.len(),
                    active.len()
                )));
            }
            let completions: Vec<Completion> = reply.completions.into_iter().collect();
            let answers = self.answer_all(&completions, codec, turn + 1 == self.max_turns)?;
            let mut going = Vec::with_capacity(active.len());
            for ((&i, c), (between, calls)) in active.iter().zip(completions).zip(answers) {
                let t = &mut out[i];
                t.calls.add(&calls);
                contexts[i].extend(c.tokens.iter());
                t.turns.push(c);
                let Some(ids) = between else { continue };
                let after = t.len() + ids.len();
                if after + max_tokens > budget {
                    continue;
                }
                contexts[i].extend(&ids);
                t.between.push(ids);
                going.push(i);
            }
            active = going;
        }
        Ok(out)
    }

    /// [`ToolUse::answer`] of every completion of a turn, on a few threads (a tool call may
    /// take its time: the python sandbox's limits are seconds), in order.
    fn answer_all(
        &self,
        completions: &[Completion],
        codec: &PromptCodec,
        last: bool,
    ) -> Result<Vec<Answer>, RlError> {
        let width = std::thread::available_parallelism().map_or(2, |n| n.get() * 2);
        let chunk = completions.len().div_ceil(width).max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = completions
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|c| {
                                let mut calls = Calls::default();
                                let ids = self.answer(c, codec, &mut calls, last)?;
                                Ok((ids, calls))
                            })
                            .collect::<Vec<Result<_, RlError>>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join().unwrap_or_else(|_| {
                        vec![Err(RlError::failed("a tool-call thread panicked"))]
                    })
                })
                .collect()
        })
    }

    /// The ids that answer turn `c`'s tool calls (`None`: the trajectory ends there: no call,
    /// the engine did not stop itself, or `last`); its calls are counted in `calls`.
    fn answer(
        &self,
        c: &Completion,
        codec: &PromptCodec,
        calls: &mut Calls,
        last: bool,
    ) -> Result<Option<Vec<u32>>, RlError> {
        let text = codec.decode(&c.tokens)?;
        let parsed = self.family.parse(&text);
        calls.attempted += parsed.len() as u64;
        calls.well_formed += parsed.iter().filter(|p| p.is_well_formed()).count() as u64;
        if parsed.is_empty() || last || c.finish_reason != FinishReason::Stop {
            return Ok(None);
        }
        let messages: Vec<Message> = parsed
            .iter()
            .map(|p| {
                let result = match p {
                    ParsedCall::Call {
                        name, arguments, ..
                    } if self.tools.contains(name) => run_builtin(name, arguments),
                    ParsedCall::Call { name, .. } => {
                        Err(tandem_model::tools::ToolError::UnknownTool {
                            name: name.clone(),
                            offered: self.tools.join(", "),
                        })
                    }
                    ParsedCall::Malformed { reason, .. } => {
                        Err(tandem_model::tools::ToolError::Malformed {
                            reason: reason.clone(),
                        })
                    }
                };
                if result.is_ok() {
                    calls.answered += 1;
                } else {
                    calls.failed += 1;
                }
                self.family.result_message(&result)
            })
            .collect();
        let stop = c.tokens.last().copied();
        codec.between_turns(&text, stop, &messages).map(Some)
    }
}

/// The engine's answers to `request` (an evaluation's): with `codec`'s tools each
/// trajectory's last turn, after the turns [`ToolUse::run`] runs; without, the reply itself.
pub fn answers(
    request: GenerateRequest,
    codec: &PromptCodec,
    generate: &mut dyn FnMut(GenerateRequest) -> Result<GenerateResponse, RlError>,
) -> Result<GenerateResponse, RlError> {
    let Some(tools) = codec.tools() else {
        return generate(request);
    };
    let mut weight_version = 0;
    let trajectories = tools.run(request, codec, &mut |r| {
        let reply = generate(r)?;
        weight_version = reply.weight_version;
        Ok(reply)
    })?;
    let empty = || Completion::new(Vec::new(), Vec::new(), FinishReason::Aborted);
    Ok(GenerateResponse {
        completions: trajectories
            .into_iter()
            .map(|mut t| t.turns.pop().unwrap_or_else(empty))
            .collect(),
        weight_version,
    })
}

/// Tokens a trajectory of `section`'s may hold after its prompt with `max_tokens` per turn:
/// `max_tokens` single-turn; with tools its budget (default `max_turns × max_tokens`).
pub fn after_prompt(section: &EnvironmentSection, max_tokens: u32) -> u32 {
    match (section.tools.is_empty(), section.max_trajectory_tokens) {
        (true, _) => max_tokens,
        (false, Some(b)) => b,
        (false, None) => section.max_turns.max(1).saturating_mul(max_tokens),
    }
}

/// The samples of trajectory `t` (id `id` of its rollout) of group `group` with
/// `prompt`: one per assistant turn, its prompt everything before the turn (the exact ids),
/// its completion and logprobs the engine's; `turn` is set when `multi` (a run with tools).
pub fn samples(t: &Trajectory, at: Place<'_>, reward: f32, version: u64) -> Vec<Sample> {
    let mut context = if at.multi {
        at.prompt.to_vec()
    } else {
        Vec::new()
    };
    let of = t.turns.len() as u32;
    let mut out = Vec::with_capacity(t.turns.len());
    for (k, c) in t.turns.iter().enumerate() {
        let prompt = if at.multi {
            context.clone()
        } else {
            at.prompt.to_vec()
        };
        if at.multi {
            context.extend(c.tokens.iter());
            context.extend(t.between.get(k).into_iter().flatten());
        }
        out.push(Sample {
            group: at.group,
            prompt,
            completion: c.tokens.to_vec(),
            logprobs: c.logprobs.to_vec(),
            reward,
            version,
            turn: at.multi.then_some(Turn {
                trajectory: at.id,
                index: k as u32,
                of,
            }),
        });
    }
    out
}

/// Where a trajectory's samples go: its group and prompt, its id in the rollout, and
/// whether the run is multi-turn.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The group (problem) it belongs to.
    pub group: usize,
    /// The problem's prompt ids.
    pub prompt: &'a [u32],
    /// Its id in the rollout (never reused: a retry gets a new one).
    pub id: u64,
    /// Whether the run uses tools.
    pub multi: bool,
}

/// The ids after the first prompt of the trajectory whose last turn ends `samples`, and
/// their mask (1: the engine's tokens, trained; 0: the tools' and the template's), rebuilt
/// from its turns' samples: what [`Trajectory::tokens_and_mask`] gives for it.
pub fn ending(samples: &[Sample]) -> Option<(Vec<u32>, Vec<u8>)> {
    let last = samples.last()?;
    let t = last.turn?;
    let first = samples.len().checked_sub(t.of as usize)?;
    let turns = &samples[first..];
    let start = turns.first()?.prompt.len();
    let mut ids = last.prompt.get(start..)?.to_vec();
    ids.extend(&last.completion);
    let mut mask = vec![0u8; ids.len()];
    for s in turns {
        let from = s.prompt.len().checked_sub(start)?;
        mask.get_mut(from..from + s.completion.len())?.fill(1);
    }
    Some((ids, mask))
}
