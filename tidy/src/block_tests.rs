//! Tests of the `crate-edges` block parser.

use super::parse_block;

const DOC: &str = "# Arch\n\n```\nnot ours -> x\n```\n\n```crate-edges\n# comment\nlayer host: a b\nlayer plugin: c   # trailing\n\na -> b\nc ->\n```\n";

#[test]
fn a_block_parses_with_lines() {
    let (block, problems) = parse_block(DOC);
    assert!(problems.is_empty(), "{problems:?}");
    let Some(block) = block else {
        panic!("no block");
    };
    assert_eq!(block.fence_line, 7);
    assert_eq!(block.layer_of("b"), Some("host"));
    assert_eq!(block.layer_of("c"), Some("plugin"));
    assert_eq!(block.layer_of("x"), None);
    assert_eq!(block.layers["plugin"].line, 10);
    assert_eq!(block.edges["a"].line, 12);
    assert!(block.edges["a"].crates.contains("b"));
    assert!(block.edges["c"].crates.is_empty());
    assert!(!block.edges.contains_key("not ours"));
}

#[test]
fn no_block_and_two_blocks_are_problems() {
    let (block, problems) = parse_block("# Arch\n```rust\nfn f() {}\n```\n");
    assert!(block.is_none());
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].0, None);

    let twice = format!("{DOC}\n```crate-edges\n```\n");
    let (_, problems) = parse_block(&twice);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].0, Some(16));
}

#[test]
fn bad_lines_are_problems_at_their_line() {
    let doc = "```crate-edges\nlayer host a\nlayer host: a\nlayer plugin: a\na b\na -> b b\nb -> b\nc -> d\nc -> e\n```\n";
    let (_, problems) = parse_block(doc);
    let lines: Vec<Option<usize>> = problems.iter().map(|p| p.0).collect();
    assert_eq!(
        lines,
        vec![Some(2), Some(4), Some(5), Some(6), Some(7), Some(9)],
        "{problems:?}"
    );
}
