//! Tests of the tool layer: family detection and names, parsing each family's well-formed,
//! several and malformed calls, the built-in dispatch, and the round trip completion → call →
//! calculator → tool message rendered by a template.
//!
//! Neither shipped model's template has tool support (SmolLM2-Instruct's is plain ChatML; the
//! tiny preset has none), so the round trip renders through two fixtures written for these
//! tests in the structure of the real templates' tool branches: [`QWEN25_STYLE_FIXTURE`]
//! (Qwen2.5-Instruct: consecutive `tool` messages in one `user` turn, each in
//! `<tool_response>`) and [`LLAMA31_STYLE_FIXTURE`] (Llama 3.1: `tool`/`ipython` rendered under
//! an `ipython` header, content through `tojson` when it `is iterable`). They are not the
//! vendors' files; their tool branches were compared with the published templates' by reading.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::chat::ChatTemplate;

/// SmolLM2-135M-Instruct's template, as shipped (no tool support).
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A minimal Qwen2.5-style tool template (test fixture, see the module doc).
const QWEN25_STYLE_FIXTURE: &str = r#"{%- if tools %}
{{- '<|im_start|>system\nCall a function as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}"#;

/// A minimal Llama-3.1-style tool template (test fixture, see the module doc).
const LLAMA31_STYLE_FIXTURE: &str = r#"{{- bos_token }}
{%- if tools %}
{{- '<|start_header_id|>system<|end_header_id|>\n\nRespond with {"name": function name, "parameters": arguments}; built-ins after <|python_tag|><|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "tool" or message.role == "ipython" %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' }}
{%- if message.content is mapping or message.content is iterable %}
{{- message.content | tojson }}
{%- else %}
{{- message.content }}
{%- endif %}
{{- '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}"#;

fn call(name: &str, arguments: Value, span: std::ops::Range<usize>) -> ParsedCall {
    ParsedCall::Call {
        name: name.to_owned(),
        arguments,
        span,
    }
}

/// The reason of a malformed call with `span`, or a failure naming what came back.
fn malformed(got: &ParsedCall, span: std::ops::Range<usize>) -> String {
    match got {
        ParsedCall::Malformed { span: s, reason } if *s == span => reason.clone(),
        other => panic!("expected Malformed at {span:?}, got {other:?}"),
    }
}

#[test]
fn families_are_detected_from_the_template_or_named() {
    assert_eq!(
        ToolFamily::detect(QWEN25_STYLE_FIXTURE),
        Some(ToolFamily::Hermes)
    );
    assert_eq!(
        ToolFamily::detect(LLAMA31_STYLE_FIXTURE),
        Some(ToolFamily::Llama3)
    );
    assert_eq!(
        ToolFamily::detect("{{ 'ipython' }} {\"name\": x, \"parameters\": y}"),
        Some(ToolFamily::Llama3)
    );
    assert_eq!(ToolFamily::detect(SMOLLM2), None);
    assert_eq!(ToolFamily::detect("[TOOL_CALLS] <|tool_call|>"), None);
    assert_eq!(
        ToolFamily::detect("<tool_call>\n<function=name>\n</tool_call>"),
        None
    );
    assert_eq!(ToolFamily::resolve(SMOLLM2, None), Err(ToolError::NoFamily));
    assert_eq!(
        ToolFamily::resolve(SMOLLM2, Some("Qwen2.5")),
        Ok(ToolFamily::Hermes)
    );
    assert_eq!(
        ToolFamily::resolve(QWEN25_STYLE_FIXTURE, Some("llama3")),
        Ok(ToolFamily::Llama3)
    );
    for f in [ToolFamily::Hermes, ToolFamily::Llama3] {
        assert_eq!(ToolFamily::from_name(&f.to_string()), Ok(f));
    }
    let e = ToolFamily::from_name("mistral").unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown tool-call family \"mistral\": use one of `hermes` (also `qwen`), `llama3`"
    );
    assert!(!ToolError::NoFamily.to_string().contains('\n'));
}

#[test]
fn hermes_reads_one_and_several_calls() {
    let one = "I will compute it.\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"2+2\"}}\n</tool_call>";
    let calls = parse(ToolFamily::Hermes, one);
    assert_eq!(
        calls,
        vec![call(
            "calculate",
            json!({"expression": "2+2"}),
            19..one.len()
        )]
    );
    assert!(one[calls[0].span().clone()].starts_with("<tool_call>"));

    let a = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
    let b = "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>";
    let two = format!("{a}\n{b}");
    assert_eq!(
        parse(ToolFamily::Hermes, &two),
        vec![
            call("a", json!({}), 0..a.len()),
            call("b", json!({"x": [1, 2]}), a.len() + 1..two.len()),
        ]
    );
    assert_eq!(parse(ToolFamily::Hermes, "The answer is 4."), vec![]);
    // A Llama-3-style object is not a Hermes call.
    assert_eq!(
        parse(ToolFamily::Hermes, "{\"name\": \"a\", \"parameters\": {}}"),
        vec![]
    );
}

#[test]
fn hermes_returns_every_malformed_call_with_its_reason() {
    let cases: &[(&str, &str)] = &[
        (
            "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>",
            "not valid JSON",
        ),
        (
            "<tool_call>{\"name\": \"a\"} trailing</tool_call>",
            "not valid JSON",
        ),
        ("<tool_call>[1, 2]</tool_call>", "not a JSON object"),
        ("<tool_call>{\"arguments\": {}}</tool_call>", "no \"name\""),
        (
            "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
            "\"name\" is empty",
        ),
        (
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
            "\"name\" is not a string",
        ),
        (
            "<tool_call>{\"name\": \"a\"}</tool_call>",
            "no \"arguments\" object",
        ),
        (
            "<tool_call>{\"name\": \"a\", \"arguments\": \"{}\"}</tool_call>",
            "\"arguments\" is not a JSON object",
        ),
        (
            "<tool_call>{\"name\": \"a\", \"arguments\": {}}",
            "unclosed `<tool_call>`",
        ),
        ("</tool_call>", "without an opening"),
    ];
    for (text, want) in cases {
        let calls = parse(ToolFamily::Hermes, text);
        assert_eq!(calls.len(), 1, "{text:?}: {calls:?}");
        let reason = malformed(&calls[0], 0..text.len());
        assert!(reason.contains(want), "{text:?}: {reason}");
        assert!(!reason.contains('\n'), "{text:?}: {reason}");
    }
    // An unclosed call before a good one: both come back, in order.
    let bad = "<tool_call>{\"name\": \"a\"\n";
    let good = "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    let text = format!("{bad}{good} and </tool_call>");
    let calls = parse(ToolFamily::Hermes, &text);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(malformed(&calls[0], 0..bad.len()).contains("before the next `<tool_call>`"));
    assert_eq!(
        calls[1],
        call("b", json!({}), bad.len()..bad.len() + good.len())
    );
    assert!(malformed(&calls[2], text.len() - 12..text.len()).contains("without an opening"));
}

#[test]
fn llama3_reads_bare_and_tagged_calls() {
    let bare = "{\"name\": \"calculate\", \"parameters\": {\"expression\": \"6*7\"}}";
    assert_eq!(
        parse(ToolFamily::Llama3, bare),
        vec![call(
            "calculate",
            json!({"expression": "6*7"}),
            0..bare.len()
        )]
    );
    let tagged = format!("<|python_tag|>{bare}<|eom_id|>");
    assert_eq!(
        parse(ToolFamily::Llama3, &tagged),
        vec![call(
            "calculate",
            json!({"expression": "6*7"}),
            0..tagged.len() - 10
        )]
    );
    // Leading whitespace, `"arguments"`, and two calls separated by `;`.
    let a = "{\"name\": \"a\", \"arguments\": {}}";
    let b = "{\"name\": \"b\", \"parameters\": {\"k\": 1}}";
    let two = format!(" {a}; {b}<|eot_id|>");
    let b_at = a.len() + 3;
    assert_eq!(
        parse(ToolFamily::Llama3, &two),
        vec![
            call("a", json!({}), 1..1 + a.len()),
            call("b", json!({"k": 1}), b_at..b_at + b.len())
        ]
    );
    // A bare call, then a tagged one.
    let mixed = format!("{a}\n<|python_tag|>{b}");
    assert_eq!(
        parse(ToolFamily::Llama3, &mixed),
        vec![
            call("a", json!({}), 0..a.len()),
            call("b", json!({"k": 1}), a.len() + 1..mixed.len())
        ]
    );
    // Prose is an answer, not a call; the Hermes format is not a Llama 3 call.
    assert_eq!(parse(ToolFamily::Llama3, "The answer is {42}."), vec![]);
    assert_eq!(
        parse(
            ToolFamily::Llama3,
            "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"
        ),
        vec![]
    );
}

#[test]
fn llama3_returns_every_malformed_call_with_its_reason() {
    let cases: &[(&str, &str)] = &[
        ("{\"name\": \"a\", \"parameters\": {", "not valid JSON"),
        (
            "<|python_tag|>{\"name\": \"a\", \"parameters\": {",
            "not valid JSON",
        ),
        ("{\"parameters\": {}}", "no \"name\""),
        ("{\"name\": \"a\"}", "no \"parameters\" object"),
        (
            "{\"name\": \"a\", \"parameters\": [1]}",
            "\"parameters\" is not a JSON object",
        ),
        (
            "<|python_tag|>brave_search.call(query=\"x\")",
            "built-in tool code calls",
        ),
        ("<|python_tag|>  ", "no call after it"),
    ];
    for (text, want) in cases {
        let calls = parse(ToolFamily::Llama3, text);
        assert_eq!(calls.len(), 1, "{text:?}: {calls:?}");
        let reason = malformed(&calls[0], 0..text.len());
        assert!(reason.contains(want), "{text:?}: {reason}");
        assert!(!reason.contains('\n'), "{text:?}: {reason}");
    }
    // A good call followed by junk: the call, then the junk as malformed.
    let good = "{\"name\": \"a\", \"parameters\": {}}";
    let text = format!("{good} then words<|eot_id|>");
    let calls = parse(ToolFamily::Llama3, &text);
    assert_eq!(calls[0], call("a", json!({}), 0..good.len()));
    assert!(
        malformed(&calls[1], good.len() + 1..text.len() - 10).contains("expected a JSON object")
    );
    assert_eq!(calls.len(), 2);
}

#[test]
fn builtin_dispatch_runs_the_calculator_or_says_why_not() {
    assert_eq!(
        run_builtin("calculate", &json!({"expression": "2^10 - 24"})),
        Ok("1000".to_owned())
    );
    assert!(matches!(
        run_builtin("calculate", &json!({"expr": "1"})),
        Err(ToolError::BadArguments { .. })
    ));
    assert_eq!(
        run_builtin("search", &json!({})).unwrap_err().to_string(),
        "unknown tool \"search\": the tools offered are: calculate, python"
    );
    assert_eq!(
        calculator_schema()["function"]["name"],
        json!(BUILTIN_TOOLS[0])
    );
}

/// Parses `completion`, runs its one call, and renders the conversation with the tool's
/// answer through `template`; returns the rendering before and after the answer.
fn round_trip(family: ToolFamily, template: &str, completion: &str) -> (String, String) {
    let template = ChatTemplate::new(template, "<|begin_of_text|>", "<|end|>");
    let [
        ParsedCall::Call {
            name, arguments, ..
        },
    ] = &parse(family, completion)[..]
    else {
        panic!("expected one call in {completion:?}");
    };
    let answer = family.result_message(&run_builtin(name, arguments));
    let mut messages = vec![
        Message::new("user", "What is 2^10 - 24?"),
        Message::new("assistant", completion),
    ];
    let before = template.render_turns(&messages, false).unwrap();
    messages.push(answer);
    (before, template.render(&messages).unwrap())
}

#[test]
fn round_trip_hermes_call_to_tool_response() {
    let completion = "<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"2^10 - 24\"}}\n</tool_call>";
    let (before, after) = round_trip(ToolFamily::Hermes, QWEN25_STYLE_FIXTURE, completion);
    assert_eq!(
        after,
        format!(
            "{before}<|im_start|>user\n<tool_response>\n1000\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n"
        )
    );
}

#[test]
fn round_trip_llama3_call_to_ipython_message() {
    let completion =
        "<|python_tag|>{\"name\": \"calculate\", \"parameters\": {\"expression\": \"2^10 - 24\"}}";
    let (before, after) = round_trip(ToolFamily::Llama3, LLAMA31_STYLE_FIXTURE, completion);
    assert!(before.starts_with("<|begin_of_text|><|start_header_id|>user"));
    // Llama 3.1's `content is iterable` branch is true for a string (in Jinja2 as in
    // minijinja), so the answer is rendered through `tojson`: quoted.
    assert_eq!(
        after,
        format!(
            "{before}<|start_header_id|>ipython<|end_header_id|>\n\n\"1000\"<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    );
}

#[test]
fn tool_errors_go_back_as_the_tool_message() {
    let t = ChatTemplate::new(QWEN25_STYLE_FIXTURE, "", "");
    let msg = ToolFamily::Hermes.result_message(&calculate("1/0"));
    let text = t.render_turns(&[msg], false).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\n<tool_response>\nerror: division by zero\n</tool_response><|im_end|>\n"
    );
}

#[test]
fn qwen_tool_messages_of_a_turn_render_together() {
    // Two answers in one turn share a `user` turn: appending the second one rewrites the
    // first's `<|im_end|>`, so rendering them one at a time is not append-only.
    let t = ChatTemplate::new(QWEN25_STYLE_FIXTURE, "", "");
    let a = ToolFamily::Hermes.tool_message("3");
    let b = ToolFamily::Hermes.tool_message("4");
    let one = t.render_turns(std::slice::from_ref(&a), false).unwrap();
    let both = t.render_turns(&[a, b], false).unwrap();
    assert_eq!(
        both,
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n\
         </tool_response><|im_end|>\n"
    );
    assert!(!both.starts_with(&one));
}

/// Checks the parser's contract on `text`: spans in bounds, in order, not overlapping, and
/// every opening tag of the family inside some span (nothing dropped).
fn check_contract(family: ToolFamily, text: &str) {
    let calls = parse(family, text);
    let mut last = 0;
    for c in &calls {
        let s = c.span();
        assert!(
            last <= s.start && s.start < s.end && s.end <= text.len(),
            "{text:?}: {calls:?}"
        );
        assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
        last = s.end;
    }
    let opener = match family {
        ToolFamily::Hermes => "<tool_call>",
        ToolFamily::Llama3 => "<|python_tag|>",
    };
    for (at, _) in text.match_indices(opener) {
        let covered = calls.iter().any(|c| c.span().contains(&at));
        assert!(covered, "{text:?}: {calls:?}");
    }
    if family == ToolFamily::Llama3 && (text.trim_start().starts_with('{') || text.contains(opener))
    {
        assert!(!calls.is_empty(), "{text:?}");
    }
}

#[test]
fn every_cut_of_a_completion_parses_without_panic_or_loss() {
    let hermes = "ok <tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"1×2\"}}\n</tool_call>é</tool_call><tool_call>{\"name\"";
    let llama =
        " <|python_tag|>{\"name\": \"c\", \"parameters\": {\"e\": \"ü\"}}; {\"name\": 1}<|eom_id|>";
    for text in [hermes, llama] {
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|i| text.is_char_boundary(*i))
            .collect();
        for &i in &cuts {
            for &j in cuts.iter().filter(|j| **j >= i) {
                check_contract(ToolFamily::Hermes, &text[i..j]);
                check_contract(ToolFamily::Llama3, &text[i..j]);
            }
        }
    }
    let expr = "-(1.5 + 2^-3) * (7 / (2 - 2)) ** 2 × 9";
    let cuts: Vec<usize> = (0..=expr.len())
        .filter(|i| expr.is_char_boundary(*i))
        .collect();
    for &i in &cuts {
        for &j in cuts.iter().filter(|j| **j >= i) {
            if let Err(e) = calculate(&expr[i..j]) {
                assert!(!e.to_string().contains('\n'));
            }
        }
    }
    assert_eq!(
        calculate("2 × 3"),
        Err(ToolError::UnknownToken { at: 2, found: '×' })
    );
}
