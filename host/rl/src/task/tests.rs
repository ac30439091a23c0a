//! Tests of the built-in tasks: problems are pure functions of (seed, i), answers and rewards.

#![allow(clippy::unwrap_used)]

use super::*;

fn section(kind: &str, options: &str) -> TaskSection {
    TaskSection {
        kind: kind.into(),
        options: toml::from_str(options).unwrap(),
    }
}

#[test]
fn problems_are_deterministic_per_seed_and_index() {
    let t = build(&section("arithmetic", ""), 7).unwrap();
    let again = build(&section("arithmetic", ""), 7).unwrap();
    let other = build(&section("arithmetic", ""), 8).unwrap();
    let a: Vec<_> = (0..50).map(|i| t.problem(i)).collect();
    let b: Vec<_> = (0..50).map(|i| again.problem(i)).collect();
    let c: Vec<_> = (0..50).map(|i| other.problem(i)).collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Not one problem repeated 50 times.
    assert!(a.iter().filter(|p| p.prompt != a[0].prompt).count() > 30);
}

#[test]
fn arithmetic_answers_are_right() {
    let t = build(
        &section("arithmetic", "ops = [\"+\", \"-\"]\nmax_operand = 50"),
        1,
    )
    .unwrap();
    for i in 0..200 {
        let p = t.problem(i);
        let body = p
            .prompt
            .strip_prefix("Q: ")
            .unwrap()
            .strip_suffix("=? A:")
            .unwrap();
        let (a, op, b) = match body.split_once('+') {
            Some((a, b)) => (a, '+', b),
            None => {
                let (a, b) = body.split_once('-').unwrap();
                (a, '-', b)
            }
        };
        let (a, b): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
        assert!(a <= 50 && b <= 50);
        let want = if op == '+' { a + b } else { a - b };
        assert!(want >= 0);
        assert_eq!(p.answer, want.to_string());
        assert_eq!(t.reward(&p, &format!(" {want}")), 1.0);
    }
}

#[test]
fn reverse_answers_are_right() {
    let t = build(&section("reverse", "min_digits = 3\nmax_digits = 3"), 0).unwrap();
    let p = t.problem(3);
    let digits = p
        .prompt
        .strip_prefix("Q: reverse ")
        .unwrap()
        .strip_suffix(" A:")
        .unwrap();
    assert_eq!(digits.len(), 3);
    assert_eq!(p.answer, digits.chars().rev().collect::<String>());
}

#[test]
fn rewards_exact_and_partial() {
    assert_eq!(score_answer(RewardKind::Exact, "12", " 12"), 1.0);
    // Not stopping after the answer is not an exact answer.
    assert_eq!(score_answer(RewardKind::Exact, "12", " 12 12 12"), 0.0);
    assert_eq!(score_answer(RewardKind::Exact, "12", " 13"), 0.0);
    assert_eq!(score_answer(RewardKind::Partial, "12", " 12"), 1.0);
    let half = score_answer(RewardKind::Partial, "12", " 13");
    assert!((half - 0.45).abs() < 1e-6, "{half}");
    assert_eq!(score_answer(RewardKind::Partial, "12", ""), 0.0);
    assert_eq!(score_answer(RewardKind::Partial, "12", " 99"), 0.0);
    // A longer guess is penalised by its length.
    let long = score_answer(RewardKind::Partial, "12", " 1234");
    assert!((long - 0.45).abs() < 1e-6, "{long}");
    let rambling = score_answer(RewardKind::Partial, "12", " 12 12 12");
    assert!(rambling < 0.25, "{rambling}");
}

#[test]
fn bad_options_are_one_line_errors() {
    let cases = [
        ("max_operand = 0", "max_operand"),
        ("bogus = 1", "bogus"),
        ("ops = [\"*\"]", "*"),
    ];
    for (options, named) in cases {
        let e = build(&section("arithmetic", options), 0).err().unwrap();
        assert!(e.to_string().contains(named), "{e}");
    }
    let e = build(&section("nope", ""), 0).err().unwrap();
    assert!(e.to_string().contains("unknown task `nope`"), "{e}");
    assert!(!e.to_string().contains('\n'));
    // How to fix it is data; the edge renders it on the same line.
    let help = e.help.clone().unwrap_or_default();
    assert!(help.contains("arithmetic, reverse"), "{help}");
    let e = e.into_error("job.toml");
    assert_eq!(e.help(), Some(help));
}
