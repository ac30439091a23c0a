//! Tests of the built-in tasks: problems are pure functions of (seed, i), answers and rewards.

#![allow(clippy::unwrap_used)]

use super::*;

fn section(kind: &str, options: &str) -> TaskSpec {
    TaskSpec {
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
}

#[test]
fn word_problems_are_deterministic_and_right() {
    let t = build(&section("word_problems", "ops = [\"+\", \"-\", \"*\"]"), 3).unwrap();
    let again = build(&section("word_problems", "ops = [\"+\", \"-\", \"*\"]"), 3).unwrap();
    let mut distinct = std::collections::HashSet::new();
    for i in 0..300 {
        let p = t.problem(i);
        assert_eq!(p, again.problem(i));
        assert!(p.prompt.ends_with(" Answer with a number."), "{}", p.prompt);
        assert!(!p.prompt.contains('{'), "{}", p.prompt);
        // The story's two numbers give the answer under one of the operations.
        let nums: Vec<i64> = p
            .prompt
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(nums.len(), 2, "{}", p.prompt);
        let answer: i64 = p.answer.parse().unwrap();
        assert!(answer >= 0);
        let (a, b) = (nums[0], nums[1]);
        assert!(
            [a + b, (a - b).abs(), a * b].contains(&answer),
            "{} -> {answer}",
            p.prompt
        );
        assert_eq!(t.reward(&p, &format!("The answer is {answer}.")), 1.0);
        assert_eq!(
            t.reward(&p, &format!("{answer} and then {}", answer + 1)),
            0.0
        );
        distinct.insert(p.prompt);
    }
    assert!(distinct.len() > 290, "{}", distinct.len());
    // Two-digit operands by default; `digits` widens them.
    let p = build(&section("word_problems", "digits = 4\nops = [\"+\"]"), 0)
        .unwrap()
        .problem(0);
    let sum: i64 = p.answer.parse().unwrap();
    assert!((2000..=19998).contains(&sum), "{}", p.prompt);
}

#[test]
fn word_problem_options_are_checked() {
    for (options, named) in [
        ("digits = 0", "digits"),
        ("digits = 7", "digits"),
        ("ops = []", "ops"),
        ("ops = [\"/\"]", "/"),
        ("reward = \"exact\"", "reward"),
    ] {
        let e = build(&section("word_problems", options), 0).err().unwrap();
        assert!(e.to_string().contains(named), "{options}: {e}");
    }
}

#[test]
fn the_last_integer_is_extracted() {
    for (text, want) in [
        ("-5", Some(-5)),
        ("1,234", Some(1234)),
        ("no number here", None),
        ("", None),
        ("12 apples and 7 pears, so 19", Some(19)),
        ("The answer is 57.", Some(57)),
        ("x = -12", Some(-12)),
        ("10-3", Some(3)),
        ("2.5", None),
        ("about 3.0", Some(3)),
        ("1,234,567 coins", Some(1_234_567)),
        ("a list: 1, 2, 3", Some(3)),
        ("12 then 2.5", None),
        ("99999999999999999999999", None),
    ] {
        assert_eq!(last_integer(text), want, "{text:?}");
    }
}

#[test]
fn held_out_prompts_never_reach_training() {
    let eval = Some(8);
    // A small space (16 problems): collisions happen and are replaced.
    let small = section("arithmetic", "max_operand = 3");
    let held = HeldOut::new(&small, 5, 8).unwrap();
    let plain = build(&small, 5).unwrap();
    let train = build_for_run(&small, 5, eval).unwrap();
    let mut replaced = 0;
    for i in 0..2000 {
        let p = train.problem(i);
        assert!(!held.contains(&p.prompt), "{i}: {}", p.prompt);
        assert_eq!(p.index, i);
        let q = plain.problem(i);
        if held.contains(&q.prompt) {
            replaced += 1;
        } else {
            // Problems that do not collide are the plain task's.
            assert_eq!(p, q);
        }
    }
    assert!(replaced > 0);
    // Word problems: the held-out set is fixed by (task, seed, size) and disjoint from the
    // first training problems.
    let words = section("word_problems", "");
    let held = HeldOut::new(&words, 5, 64).unwrap();
    assert_eq!(
        held.problems(),
        HeldOut::new(&words, 5, 64).unwrap().problems()
    );
    assert_ne!(
        held.problems(),
        HeldOut::new(&words, 6, 64).unwrap().problems()
    );
    let train = build_for_run(&words, 5, eval).unwrap();
    let plain = build(&words, 5).unwrap();
    for i in 0..5000 {
        let p = train.problem(i);
        assert!(!held.contains(&p.prompt), "{i}");
        assert_eq!(p, plain.problem(i), "no collision: the plain stream");
    }
    // Without [eval] the run trains on the plain task.
    let t = build_for_run(&small, 5, None).unwrap();
    assert_eq!(t.problem(3), build(&small, 5).unwrap().problem(3));
}

#[test]
fn a_long_tail_asks_some_problems_for_a_repeated_answer_and_keeps_the_rest() {
    let plain = build(&section("arithmetic", "max_operand = 3"), 5).unwrap();
    let tail = build(
        &section(
            "arithmetic",
            "max_operand = 3\nlong_tail = 0.25\nlong_repeat = 12",
        ),
        5,
    )
    .unwrap();
    let mut long = 0;
    for i in 0..400 {
        let (p, t) = (plain.problem(i), tail.problem(i));
        if t.prompt.ends_with("x12 A:") {
            long += 1;
            assert_eq!(t.prompt, p.prompt.replace("=? A:", "=? x12 A:"));
            assert_eq!(t.answer, p.answer.repeat(12));
            assert_eq!(tail.reward(&t, &format!(" {}", t.answer)), 1.0);
            assert!(tail.reward(&t, &format!(" {}", p.answer)) < 0.1);
        } else {
            // The other problems are the plain task's.
            assert_eq!((t.prompt, t.answer), (p.prompt, p.answer));
        }
    }
    assert!((60..140).contains(&long), "{long} of 400 long");
    for bad in ["long_tail = 1.5", "long_repeat = 1"] {
        let Err(e) = build(&section("arithmetic", bad), 5) else {
            panic!("{bad} accepted");
        };
        assert!(
            e.to_string().contains(bad.split(' ').next().unwrap()),
            "{e}"
        );
    }
}
