//! Tests of the turn loop with a scripted engine (a test fixture: a closure that answers each
//! turn's request from a script) on SmolLM2's ChatML template and a byte-level tokenizer:
//! the ids between turns are exactly the template's text after the engine's stop token, the
//! next turn's context is the previous one with the engine's ids and those appended, errors
//! go back to the model as the tool's answer, the limits end trajectories, and the samples
//! and the rebuilt mask keep every engine id trained and every other id out.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::prompt::tests::{chatml_config, model_dir};
use serde_json::json;
use tandem_plugin_api::ROption;
use tokenizers::Tokenizer;

/// `<|im_end|>`'s id in the test tokenizer (SmolLM2's EOS).
const END: u32 = 2;

struct Fixture {
    _dir: tempfile::TempDir,
    codec: PromptCodec,
    tk: Tokenizer,
}

fn fixture(section: EnvironmentSection) -> Fixture {
    let dir = model_dir(&[
        chatml_config(),
        ("generation_config.json", json!({"eos_token_id": END})),
    ]);
    let codec = PromptCodec::for_env(dir.path(), &section).unwrap();
    let tk = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    Fixture {
        _dir: dir,
        codec,
        tk,
    }
}

fn tools(max_turns: u32, budget: Option<u32>) -> EnvironmentSection {
    EnvironmentSection {
        chat: true,
        tools: vec!["calculate".into()],
        tool_format: Some("hermes".into()),
        max_turns,
        max_trajectory_tokens: budget,
        ..EnvironmentSection::default()
    }
}

impl Fixture {
    fn ids(&self, text: &str) -> Vec<u32> {
        self.tk.encode(text, false).unwrap().get_ids().to_vec()
    }

    /// The engine's completion of `text` ended by its stop token.
    fn said(&self, text: &str) -> Completion {
        let mut ids = self.ids(text);
        ids.push(END);
        let logprobs: Vec<f32> = (0..ids.len()).map(|i| -0.01 * (i + 1) as f32).collect();
        Completion::new(ids, logprobs, FinishReason::Stop)
    }

    fn request(&self, prompts: &[&str]) -> GenerateRequest {
        GenerateRequest {
            prompts: prompts
                .iter()
                .map(|p| RVec::from(self.codec.prompt(p).unwrap()))
                .collect(),
            sampling: tandem_plugin_api::SamplingParams {
                max_tokens: 100,
                seed: ROption::RSome(7),
                ..Default::default()
            },
            adapter: ROption::RNone,
        }
    }

    /// Runs the turn loop on `prompts` with an engine that answers turn `t`'s `i`-th
    /// request with `script[t][i]`; returns the trajectories and every request it got.
    fn run(&self, prompts: &[&str], script: &[&[&str]]) -> (Vec<Trajectory>, Vec<GenerateRequest>) {
        let mut seen = Vec::new();
        let tools = self.codec.tools().unwrap().clone();
        let out = tools
            .run(self.request(prompts), &self.codec, &mut |r| {
                let turn = seen.len();
                let completions = (0..r.prompts.len())
                    .map(|i| self.said(script[turn][i]))
                    .collect();
                seen.push(r);
                Ok(GenerateResponse {
                    completions,
                    weight_version: 3,
                })
            })
            .unwrap();
        (out, seen)
    }
}

const CALL: &str = "<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"6 * 7\"}}\n</tool_call>";

#[test]
fn the_next_turn_sees_the_engine_ids_then_exactly_the_template_text() {
    let f = fixture(tools(3, None));
    let (out, seen) = f.run(
        &["What is 6 times 7?", "What is 2 + 3?"],
        &[&[CALL, "It is 5."], &["It is 42."]],
    );
    assert_eq!(seen.len(), 2, "one request per turn");
    assert_eq!(
        seen[1].prompts.len(),
        1,
        "only the trajectory that called goes on"
    );
    assert_ne!(seen[0].sampling.seed, seen[1].sampling.seed);
    // Between the turns: the rest of the assistant's close after <|im_end|>, the tool
    // message, the next assistant header, tokenized on their own.
    let between = f.ids("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n");
    let t = &out[0];
    assert_eq!(t.turns.len(), 2);
    assert_eq!(t.between, vec![between.clone()]);
    let mut context = seen[0].prompts[0].to_vec();
    context.extend(t.turns[0].tokens.iter());
    context.extend(&between);
    assert_eq!(seen[1].prompts[0].to_vec(), context);
    assert_eq!(
        t.calls,
        Calls {
            attempted: 1,
            well_formed: 1,
            answered: 1,
            failed: 0
        }
    );
    // The other one answered without a call: one turn, nothing between.
    assert_eq!(out[1].turns.len(), 1);
    assert!(out[1].between.is_empty());
    assert_eq!(out[1].calls, Calls::default());
    // The system message tells the model its tools and their format.
    let prompt = f.codec.decode(&seen[0].prompts[0]).unwrap();
    assert!(
        prompt.contains("\"calculate\"") && prompt.contains("<tool_call>"),
        "{prompt}"
    );
}

#[test]
fn samples_train_exactly_the_engine_ids_and_the_mask_rebuilds() {
    let f = fixture(tools(3, None));
    let (out, seen) = f.run(&["What is 6 times 7?"], &[&[CALL], &["It is 42."]]);
    let t = &out[0];
    let prompt = seen[0].prompts[0].to_vec();
    let at = Place {
        group: 4,
        prompt: &prompt,
        id: 9,
        multi: true,
    };
    let samples = super::samples(t, at, 0.5, 3);
    assert_eq!(samples.len(), 2);
    for (k, s) in samples.iter().enumerate() {
        // Each turn's sample: the engine's ids and logprobs, after exactly what it saw.
        assert_eq!(s.completion, t.turns[k].tokens.to_vec());
        assert_eq!(s.logprobs, t.turns[k].logprobs.to_vec());
        assert_eq!(s.prompt, seen[k].prompts[0].to_vec());
        assert_eq!((s.group, s.reward, s.version), (4, 0.5, 3));
        assert_eq!(
            s.turn,
            Some(Turn {
                trajectory: 9,
                index: k as u32,
                of: 2
            })
        );
        assert_eq!(s.opens(), k == 0);
    }
    let (ids, mask) = t.tokens_and_mask();
    assert_eq!(ending(&samples), Some((ids.clone(), mask.clone())));
    let trained: Vec<u32> = ids
        .iter()
        .zip(&mask)
        .filter(|(_, m)| **m == 1)
        .map(|(i, _)| *i)
        .collect();
    let engine: Vec<u32> = t.turns.iter().flat_map(|c| c.tokens.to_vec()).collect();
    assert_eq!(trained, engine);
    assert_eq!(mask.iter().filter(|m| **m == 0).count(), t.between[0].len());
    // A single-turn run: the sample is the completion after the prompt, no turn.
    let single = Trajectory::single(f.said("It is 42."));
    let at = Place { multi: false, ..at };
    let s = super::samples(&single, at, 1.0, 0);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].prompt.clone(), s[0].turn), (prompt, None));
}

#[test]
fn bad_calls_are_answered_with_the_error_and_counted() {
    let f = fixture(tools(3, None));
    let unknown =
        "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
    let (out, _) = f.run(
        &["a", "b", "c"],
        &[
            &[
                "<tool_call>{oops</tool_call>",
                unknown,
                CALL.replace("6 * 7", "1/0").as_str(),
            ],
            &["done", "done", "done"],
        ],
    );
    for t in &out {
        assert_eq!(t.turns.len(), 2, "an error answer still gets a next turn");
        let text = f.codec.decode(&t.between[0]).unwrap();
        assert!(text.contains("error: "), "{text}");
        assert_eq!(t.calls.failed, 1);
        assert_eq!(t.calls.answered, 0);
    }
    assert_eq!(out[0].calls.well_formed, 0);
    assert_eq!(out[1].calls.well_formed, 1);
    assert!(
        f.codec
            .decode(&out[1].between[0])
            .unwrap()
            .contains("unknown tool")
    );
    assert!(
        f.codec
            .decode(&out[2].between[0])
            .unwrap()
            .contains("division by zero")
    );
}

#[test]
fn max_turns_and_the_budget_end_trajectories() {
    // The last turn's call is counted but not answered.
    let f = fixture(tools(2, Some(1000)));
    let (out, seen) = f.run(&["q"], &[&[CALL], &[CALL]]);
    assert_eq!(seen.len(), 2);
    assert_eq!((out[0].turns.len(), out[0].between.len()), (2, 1));
    assert_eq!(out[0].calls.attempted, 2);
    assert_eq!(out[0].calls.answered, 1);
    // A budget one turn wide: no second turn; the default (max_turns x max_tokens) holds.
    let f = fixture(tools(4, Some(100)));
    let (out, seen) = f.run(&["q"], &[&[CALL]]);
    assert_eq!((seen.len(), out[0].turns.len()), (1, 1));
    assert!(out[0].between.is_empty());
    let f = fixture(tools(4, None));
    let (out, _) = f.run(&["q"], &[&[CALL], &[CALL], &[CALL], &["42"]]);
    assert!(out[0].len() <= 4 * 100, "{}", out[0].len());
    // A turn the engine did not stop itself ends the trajectory.
    let mut long = f.said(CALL);
    long.finish_reason = FinishReason::Length;
    let tools = f.codec.tools().unwrap().clone();
    let mut calls = 0;
    let out = tools
        .run(f.request(&["q"]), &f.codec, &mut |_| {
            calls += 1;
            Ok(GenerateResponse {
                completions: RVec::from(vec![long.clone()]),
                weight_version: 0,
            })
        })
        .unwrap();
    assert_eq!((calls, out[0].turns.len()), (1, 1));
}

#[test]
fn a_template_that_is_not_append_only_or_no_chat_is_one_line() {
    let drops = "{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' and not loop.last %}{% set c = '' %}{% endif %}<|im_start|>{{ m['role'] }}\n{{ c }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let dir = model_dir(&[
        ("chat_template.jinja", json!(drops)),
        ("generation_config.json", json!({"eos_token_id": END})),
    ]);
    let e = PromptCodec::for_env(dir.path(), &tools(3, None))
        .err()
        .unwrap();
    let line = e.to_string();
    assert!(
        line.contains("not append-only") && line.contains("chat_template.jinja"),
        "{line}"
    );
    assert!(!line.contains('\n'), "{line}");
    let e = PromptCodec::for_env(
        dir.path(),
        &EnvironmentSection {
            chat: false,
            ..tools(3, None)
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("need chat prompts"), "{e}");
    assert!(e.help().unwrap().contains("chat = true"));
}

#[test]
fn a_python_call_that_loops_is_answered_with_its_stop_and_the_trajectory_goes_on() {
    let f = fixture(EnvironmentSection {
        tools: vec!["calculate".into(), "python".into()],
        ..tools(3, None)
    });
    let looping = "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"while True: pass\"}}\n</tool_call>";
    let printing = "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(6 * 7)\"}}\n</tool_call>";
    let (out, seen) = f.run(&["a", "b"], &[&[looping, printing], &["gave up", "42"]]);
    assert_eq!(seen.len(), 2);
    let stopped = f.codec.decode(&out[0].between[0]).unwrap();
    assert!(
        stopped.contains("error: python: ") && stopped.contains("CPU limit"),
        "{stopped}"
    );
    assert_eq!((out[0].calls.failed, out[0].turns.len()), (1, 2));
    let printed = f.codec.decode(&out[1].between[0]).unwrap();
    assert!(printed.contains("tool\n42"), "{printed}");
    assert_eq!(out[1].calls.answered, 1);
    // Both tools are shown to the model.
    let prompt = f.codec.decode(&seen[0].prompts[0]).unwrap();
    assert!(
        prompt.contains("\"python\"") && prompt.contains("\"calculate\""),
        "{prompt}"
    );
}
