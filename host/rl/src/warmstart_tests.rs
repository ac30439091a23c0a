//! Tests of the warm start's sequences: with tools a problem is a calculator call of its
//! expression, then (after the calculator's answer, in the prompt) the answer.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::env::EnvSpec;
use crate::prompt::tests::{chatml_config, model_dir};
use tandem_plugin_envs as _;

#[test]
fn a_tool_use_problem_is_a_call_then_the_answer_after_the_tools_reply() {
    let dir = model_dir(&[
        chatml_config(),
        (
            "generation_config.json",
            serde_json::json!({"eos_token_id": 2}),
        ),
    ]);
    let section = EnvironmentSection {
        plugin: "word_problems".into(),
        chat: true,
        tools: vec!["calculate".into()],
        tool_format: Some("hermes".into()),
        ..EnvironmentSection::default()
    };
    let codec = PromptCodec::for_env(dir.path(), &section).unwrap();
    let registry = Registry::builtins().unwrap();
    let spec = EnvSpec {
        section: &section,
        seed: 3,
        held_out: 0,
        base_dir: Path::new("."),
    };
    let env = Env::build(&registry, spec, None).unwrap();
    let seqs = sft_sequences(&env, &codec, 0, 2).unwrap();
    assert_eq!(seqs.len(), 4, "two turns per problem");
    for (i, pair) in seqs.chunks(2).enumerate() {
        let p = env.problem(i as u64).unwrap();
        let (call, answer) = (&pair[0], &pair[1]);
        let target = |s: &TrainSequence| s.tokens[s.prompt_len as usize..].to_vec();
        // The call: the problem's expression in the family's format, then EOS.
        let call_ids = target(call);
        assert_eq!(call_ids.last(), Some(&2));
        let text = codec.decode(&call_ids).unwrap();
        let meta: serde_json::Value = serde_json::from_str(&p.item.metadata_json).unwrap();
        let expression = meta["expression"].as_str().unwrap();
        assert!(
            text.starts_with("<tool_call>") && text.contains(expression),
            "{text}"
        );
        // The answer's prompt: the call's whole sequence, then the calculator's reply.
        let prompt = &answer.tokens[..answer.prompt_len as usize];
        assert!(
            prompt.starts_with(&call.tokens),
            "the call's ids, as trained"
        );
        let between = codec.decode(&prompt[call.tokens.len()..]).unwrap();
        assert!(
            between.contains(&format!("tool\n{}", p.answer())),
            "{between}"
        );
        assert_eq!(
            codec.decode(&target(answer)).unwrap(),
            format!("The answer is {}.", p.answer())
        );
    }
}
