//! Tests of the `notes-names` span reader and its two kinds of names.

use super::{Kind, Span, code_spans, kind};

fn spans(text: &str) -> Vec<(usize, String)> {
    code_spans(text)
        .into_iter()
        .map(|s: Span| (s.line, s.text))
        .collect()
}

fn expected(pairs: &[(usize, &str)]) -> Vec<(usize, String)> {
    pairs.iter().map(|(l, t)| (*l, (*t).to_string())).collect()
}

#[test]
fn spans_pair_runs_of_equal_length_within_a_paragraph() {
    let text = "# T\n\nSee `a/b.rs` and ``x ` y`` and\nthe `wrapped\nspan`.\n\nA lone ` tick.\n\nnext `c`\n";
    assert_eq!(
        spans(text),
        expected(&[(3, "a/b.rs"), (3, "x ` y"), (4, "wrapped\nspan"), (9, "c")])
    );
}

#[test]
fn fenced_blocks_are_skipped() {
    let text = "```rust\nlet a = `ExampleError`;\n```\n~~~~\n```\n`x`\n~~~~\nafter `y`\n";
    assert_eq!(spans(text), expected(&[(8, "y")]));
}

#[test]
fn paths_and_types_are_told_apart() {
    for path in [
        "host/rl/src/lib.rs",
        "src/prompt/",
        "../runtime/NOTES.md",
        "python/requirements-cpu.lock",
        ".ci/config.toml",
    ] {
        assert_eq!(kind(path), Some(Kind::Path), "{path}");
    }
    for other in [
        "lib.rs",
        "/tmp/x/y.rs",
        "~/.cache/tandem/python",
        "https://example.com/a.md",
        "plugins/*/NOTES.md",
        "host/runtime/src/launch/{slurm,ray}.rs",
        "run/<step>/model.json",
        "target/release/x.rs",
        "a/b.rs c",
        "scripts/cluster",
        "a/b.so",
        "RSS",
        "Registry",
        "a_crate::module",
        "Vec<u8>",
    ] {
        assert_eq!(kind(other), None, "{other}");
    }
    for ty in [
        "ExampleError",
        "ExampleError::Variant",
        "a_crate::module::ExampleType",
        "ExampleType::new()",
        "ABCModel",
    ] {
        assert_eq!(kind(ty), Some(Kind::Type), "{ty}");
    }
}
